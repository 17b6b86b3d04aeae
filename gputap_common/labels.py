"""The ``gputap.io/`` keys on Kubernetes objects, named once for the spawner that writes them
and the billing meter that reads them (docs/kubernetes.md, "Labels and annotations").

Single-user pods:

| key | label value | annotation value |
|---|---|---|
| :data:`USER` | label-safe slug | the username as is |
| :data:`SERVER` | slug ("" -> "default") | the server name as is |
| :data:`OFFERING` | | ``A100-80GB``, ``A100-80GB/1g.10gb`` or ``cpu`` |
| :data:`CARD` | ``A100-80GB`` (absent for CPU only) | |
| :data:`SLICE` | ``1g.10gb`` (slices), ``shared`` (time-sliced GPUs) | |
| :data:`COUNT` | ``2`` | |
| :data:`PRICE_CLASS` | ``on-demand`` or ``spot`` | |
| :data:`COURSE` | course slug (when course-funded) | the course's key in billing |
| :data:`ENVIRONMENT` | | the environment the server runs (the spawner's key) |
| :data:`PRICE_PER_HOUR` | | the price per unit at placement, micro-credits |
| :data:`SESSION` | | the billing session id (one per start) |
| :data:`RESERVATION` | | the hub's reservation of the pod's GPUs until it is bound |

Placeholder pods (spawner/kube/placeholders.py): :data:`PLACEHOLDER` (label: the offering as
a slug, ``a100-80gb-1g-10gb``), :data:`OFFERING` (annotation: the offering key) and
:data:`MANAGED_BY`.

Data disks' PersistentVolumeClaims: :data:`DISK` (label ``true``), :data:`DISK_NAME`,
:data:`CREATED_AT`, :data:`ATTACHED_TO` (absent: detached) and :data:`BILLING_SESSION`.
"""

from __future__ import annotations

PREFIX = "gputap.io/"

USER = f"{PREFIX}user"
SERVER = f"{PREFIX}server"
OFFERING = f"{PREFIX}offering"
CARD = f"{PREFIX}card"
SLICE = f"{PREFIX}slice"
COUNT = f"{PREFIX}count"
PRICE_CLASS = f"{PREFIX}price-class"
COURSE = f"{PREFIX}course"
ENVIRONMENT = f"{PREFIX}environment"
PRICE_PER_HOUR = f"{PREFIX}price-per-hour-micro"
SESSION = f"{PREFIX}session"
RESERVATION = f"{PREFIX}reservation"
WORKER = f"{PREFIX}worker"
GROUP = f"{PREFIX}group"
ROLE = f"{PREFIX}role"
PLACEHOLDER = f"{PREFIX}placeholder"

DISK = f"{PREFIX}disk"
DISK_NAME = f"{PREFIX}disk-name"
CREATED_AT = f"{PREFIX}created-at"
ATTACHED_TO = f"{PREFIX}attached-to"
BILLING_SESSION = f"{PREFIX}billing-session"

#: who manages an object (the app.kubernetes.io convention)
MANAGED_BY = "app.kubernetes.io/managed-by"
#: KubeSpawner's label and annotation naming a server's user
HUB_USERNAME = "hub.jupyter.org/username"
#: KubeSpawner's name of the single-user server's container in its pod
SERVER_CONTAINER = "notebook"
#: the name of a worker's container in its pod (spawner/kube/worker_objects.py)
WORKER_CONTAINER = "worker"
#: pod phases after which a pod holds nothing and runs nothing
TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
