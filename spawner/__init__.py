"""The GPU brain of the hub, in rooms by layer (docs/architecture.md):

- ``core``: pure catalog, placement, queue, form, records, disk rules;
- ``lifecycle``: the server lifecycle both backends share, billing glue, changes of GPU;
- ``local``: the one-machine backend (entry point ``gputap-local``);
- ``kube``: the Kubernetes backend (entry point ``gputap-kubernetes``);
- ``api``: the hub's gputap API and page handlers.
"""
