"""The settings of gputap's spawners, in one place: every ``c.GPUSpawnerMixin.*`` trait
hub_config/hub.py sets from the settings file (a backend's own are on its spawner class).

:class:`GPUSpawnerTraits` holds settings only, no behaviour: the lifecycle
(:mod:`.mixin`) reads them and hands them to its collaborators as arguments.
"""

from __future__ import annotations

import os

from traitlets import Dict, Integer, Unicode, default
from traitlets.config import LoggingConfigurable

from gputap_common.settings import node_at


class GPUSpawnerTraits(LoggingConfigurable):
    """Billing, catalog, queue, disks, faults, scale-out, apps and environments settings."""

    billing_url = Unicode(
        "",
        config=True,
        help="""Base URL of the billing service as the hub reaches it.

        c.GPULocalSpawner.billing_url = "http://127.0.0.1:8091/services/billing/"
        """,
    )

    billing_token = Unicode(
        config=True,
        help="""API token the hub uses for billing (scope custom:gputap-billing:hub).

        Defaults to $GPUTAP_BILLING_TOKEN. c.GPULocalSpawner.billing_token = "..."
        """,
    )

    @default("billing_token")
    def _default_billing_token(self) -> str:
        return os.environ.get("GPUTAP_BILLING_TOKEN", "")

    catalog_cards = Dict(
        config=True,
        help="""Cards to add or edit, merged over spawner/core/catalog.yaml (same keys).

        c.GPULocalSpawner.catalog_cards = {"RTX-5090": {"memory_gb": 32, "fp16_tflops": 209.5,
                                           "products": ["NVIDIA-GeForce-RTX-5090"]}}
        """,
    )

    queue_timeout = Integer(
        3600,
        config=True,
        help="""Seconds a spawn may wait in the queue for a sold-out card or slice.

        c.GPULocalSpawner.queue_timeout = 7200
        """,
    )

    disk_max_size_gb = Integer(
        100,
        config=True,
        help="""Largest data disk a user may create, in GB.

        c.GPULocalSpawner.disk_max_size_gb = 500
        """,
    )

    max_disks = Integer(
        5,
        config=True,
        help="""Most data disks one user may have.

        c.GPULocalSpawner.max_disks = 10
        """,
    )

    fault_restart = Unicode(
        "same",
        config=True,
        help="""After a GPU fault (faults.restart; docs/gpu-faults.md): "same" starts the
        server again on the same request, "allowed" also offers users the choice of a
        similar free GPU in advance (the spawn form's on_fault), "off" does not restart.

        c.GPUSpawnerMixin.fault_restart = "allowed"
        """,
    )

    max_workers = Integer(
        8,
        config=True,
        help="""Most workers one server's group may have (scale_out.max_workers); 0: no
        scale-out.

        c.GPUSpawnerMixin.max_workers = 16
        """,
    )

    worker_idle_seconds = Integer(
        600,
        config=True,
        help="""A group on which no job ran for this long is stopped, billing with it
        (scale_out.idle_seconds); 0: never.

        c.GPUSpawnerMixin.worker_idle_seconds = 900
        """,
    )

    apps = Dict(
        {"tensorboard": {"enabled": False}, "custom": {}},
        config=True,
        help="""The apps servers open from JupyterLab's launcher: the ``apps`` settings as
        loaded (hub_config/hub.py checks them at start-up). Each server gets those of its
        environment as $GPUTAP_APPS, jupyter-server-proxy's servers (spawner/core/apps.py).

        c.GPUSpawnerMixin.apps = {"tensorboard": {"enabled": True, "log_dir": "~/runs",
                                  "launcher": True, "environments": ["all"]}, "custom": {}}
        """,
    )

    #: the backend's name in the settings (spawner.backend): what its environments must hold
    backend_name = "local"

    environments = Dict(
        node_at(("environments",))["default"],
        config=True,
        help="""The environments servers run in, by key, as the ``environments:`` settings
        declare them (spawner/core/environments.py); exactly one is the default.

        c.GPULocalSpawner.environments = {
            "gputap": {"name": "gputap minimal", "default": True},
            "torch": {"name": "PyTorch", "python": "/opt/envs/torch", "image": "acme/torch:2",
                      "needs": {"gpu": True, "min_gpu_memory_gb": 16}},
        }
        """,
    )

    image_pattern = Unicode(
        "",
        config=True,
        help=r"""Free-text images users may ask for (user_options ``image``): a regular
        expression the whole image must match; empty: none. Kubernetes only.

        c.GPUKubeSpawner.image_pattern = r"ghcr\.io/acme/[a-z0-9._/-]+:[A-Za-z0-9._-]+"
        """,
    )
