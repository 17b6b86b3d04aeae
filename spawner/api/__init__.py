"""The hub's gputap handlers, in JupyterHub's style: one module per resource, each ending in
its ``default_handlers``; :data:`default_handlers` is all of them, for
``c.JupyterHub.extra_handlers``."""

from . import account, admin, disks, gpus, preview, running, servers, workers

default_handlers = [
    *preview.default_handlers,
    *account.default_handlers,
    *running.default_handlers,
    *workers.default_handlers,
    *gpus.default_handlers,
    *servers.default_handlers,
    *disks.default_handlers,
    *admin.default_handlers,
]
