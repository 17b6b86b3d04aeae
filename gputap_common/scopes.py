"""JupyterHub scopes gputap defines or asks for, named once for the hub, the spawner's API
handlers and the billing service.

``custom:`` scopes are declared to JupyterHub by the hub configuration (:data:`CUSTOM`);
billing checks the ``custom:gputap-billing:*`` ones on the tokens that call it.
"""

from __future__ import annotations

#: the hub's spawner: open accounts, admit spawns, start and stop billing sessions
BILLING_HUB = "custom:gputap-billing:hub"
#: billing admins: every account, grants, price books
BILLING_ADMIN = "custom:gputap-billing:admin"
#: Prometheus scrapers of billing's /metrics
BILLING_METRICS = "custom:gputap-billing:metrics"
#: instructors: create courses, run those they teach
BILLING_INSTRUCTOR = "custom:gputap-billing:instructor"
#: users' data disks, held on oneself (``!user``) by every user and their servers' tokens
DISKS = "custom:gputap:disks"
#: the scope billing asks of a user who reads their own account through it
BILLING_ACCESS = "access:services!service=billing"

#: the custom scopes as JupyterHub's ``custom_scopes`` setting declares them
CUSTOM = {
    BILLING_HUB: {"description": "Open accounts, admit spawns, start and stop sessions"},
    BILLING_ADMIN: {"description": "Read every billing account, fund accounts, publish prices"},
    BILLING_METRICS: {"description": "Read billing's Prometheus metrics"},
    BILLING_INSTRUCTOR: {"description": "Create courses and run the ones you teach"},
    DISKS: {"description": "List, create, attach, detach and delete data disks"},
}
