"""The hub's GPU health API (docs/gpu-faults.md): every device with its health, the fault
history, drain and return (admins), the desk's recoveries, and a server's own fault report.

- ``GET admin/gpus``: every device (and, on Kubernetes, every node) with its state;
- ``GET admin/gpu-faults?limit=N``: the fault history, newest first;
- ``POST admin/gpus/{id}/drain`` / ``.../return`` ``{"note"?}``: out of and back into service;
- ``POST admin/gpu-faults/{id}/recover`` ``{"server": "user/name"}``: recover a server hit by
  the fault (the desk posts it with the ``gputap-health`` service's token; admins may too);
- ``POST {server}/gpu-fault`` ``{"device", "kind", "detail"}``: the server's Lab extension
  reports a fault of one of its own devices.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any
from urllib.parse import unquote

from jupyterhub.scopes import has_scope
from tornado import web

from gputap_common import clock
from gputap_common.bodies import shown
from gputap_common.names import is_worker_name, server_label

from ..core.health import BookError, Fault
from ..lifecycle import faults, recovery
from ..lifecycle.change import HandlerHub
from .base import API_PATH, GPUTapAPIHandler
from .servers import _SERVER, ServerAPIHandler

ADMIN_SCOPE = "admin:servers"
GPUS_PATH = f"{API_PATH}/admin/gpus"
FAULTS_PATH = f"{API_PATH}/admin/gpu-faults"
#: what a server may report of its own devices
REPORTED_KINDS = frozenset({"lost", "ecc", "remap", "xid"})
MAX_LIMIT = 1000
#: a GPU's or MIG device's UUID as NVML (and the device plugin) names it
DEVICE_ID = re.compile(r"(GPU|MIG)-[A-Za-z0-9-]{1,80}")

# recoveries running in the background (asyncio keeps only weak references)
_tasks: set[asyncio.Task] = set()


def fault_view(fault: Fault, book: Any) -> dict[str, Any]:
    return {**fault.view(), "servers": list(book.outcomes.get(fault.id, []))}


class AdminHealthHandler(GPUTapAPIHandler):
    def admin_desk(self) -> faults.FaultDesk:
        if self.current_user is None:
            raise web.HTTPError(403, "Log in as an admin to see GPU health")
        if not has_scope(ADMIN_SCOPE, self.parsed_scopes, db=self.db):
            raise web.HTTPError(
                403, f"GPU health needs the scope {ADMIN_SCOPE} (JupyterHub admins hold it)"
            )
        desk = faults.desk()
        if desk is None:
            raise web.HTTPError(
                404, "GPU health is not watched here: the operator set faults.enabled: false"
            )
        return desk

    def known_device(self, desk: faults.FaultDesk, device_id: str) -> str:
        """The device the path names (decoded); 404 when the desk does not know it."""
        device_id = unquote(device_id)
        if not desk.knows(device_id):
            raise web.HTTPError(404, f"No GPU {shown(device_id)}: GET admin/gpus lists them")
        return device_id

    def note_body(self) -> str:
        note = self.json_body(("note",)).get("note", "")
        if not isinstance(note, str) or len(note) > 500:
            raise web.HTTPError(400, "Field 'note' must be text of at most 500 characters")
        return note


class GPUsHandler(AdminHealthHandler):
    async def get(self) -> None:
        desk = self.admin_desk()
        self.write_json(devices_view(desk))


def devices_view(desk: faults.FaultDesk) -> dict[str, Any]:
    """Every device the hub knows with its state, holder and fault; Kubernetes nodes."""
    book = desk.book
    devices: list[dict[str, Any]] = []
    seen: set[str] = set()
    for pool in desk.pools:
        for device in sorted(pool.devices.values(), key=lambda d: (d.gpu_index, d.uuid)):
            seen.add(device.uuid)
            entry = book.devices.get(device.uuid)
            fault = book.find(entry.fault) if entry and entry.fault else None
            devices.append(
                {
                    "id": device.uuid,
                    "node": pool.node,
                    "offering": device.key,
                    "label": f"GPU {device.gpu_index}: {device.key}",
                    "state": book.state(device.uuid),
                    "since": entry.since.isoformat() if entry else None,
                    "held_by": pool.holder.get(device.uuid),
                    "fault": fault.view() if fault else None,
                    "note": entry.note if entry else "",
                }
            )
    # out of service but no longer listed (a lost GPU), and Kubernetes entries
    for device_id, entry in sorted(book.devices.items()):
        if device_id in seen:
            continue
        fault = book.find(entry.fault) if entry.fault else None
        devices.append(
            {
                "id": device_id,
                "node": fault.node if fault else device_id.split("/")[0].removeprefix("node:"),
                "offering": None,
                "label": device_id,
                "state": entry.state,
                "since": entry.since.isoformat(),
                "held_by": None,
                "fault": fault.view() if fault else None,
                "note": entry.note,
            }
        )
    view: dict[str, Any] = {
        "backend": "kubernetes" if desk.cluster is not None else "local",
        "simulated": any(pool.simulated for pool in desk.pools),
        "devices": devices,
    }
    if desk.cluster is not None:
        view["nodes"] = desk.cluster_nodes()
    return view


class FaultsHandler(AdminHealthHandler):
    async def get(self) -> None:
        desk = self.admin_desk()
        raw = self.get_argument("limit", "100")
        if not (raw.isascii() and raw.isdecimal()) or not 1 <= int(raw) <= MAX_LIMIT:
            raise web.HTTPError(400, f"limit must be a whole number from 1 to {MAX_LIMIT}")
        newest = list(reversed(desk.book.faults))[: int(raw)]
        self.write_json({"faults": [fault_view(f, desk.book) for f in newest]})


class DrainHandler(AdminHealthHandler):
    async def post(self, device_id: str) -> None:
        desk = self.admin_desk()
        note = self.note_body()
        device_id = self.known_device(desk, device_id)
        try:
            entry = desk.drain(device_id, note)
        except BookError as e:
            raise web.HTTPError(409, str(e)) from None
        self.write_json({"id": device_id, **entry.view()})


class ReturnHandler(AdminHealthHandler):
    async def post(self, device_id: str) -> None:
        desk = self.admin_desk()
        note = self.note_body()
        device_id = self.known_device(desk, device_id)
        try:
            entry = desk.give_back(device_id, await desk.still_broken(device_id))
        except BookError as e:
            raise web.HTTPError(409, str(e)) from None
        self.log.info(
            "GPU %s returned to service by %s %s", device_id, self.current_user.name, note
        )
        self.write_json(
            {"id": device_id, "state": "healthy", "was": entry.view() if entry else None}
        )


class RecoverHandler(AdminHealthHandler):
    """Recover one server from a fault, in the background (202)."""

    async def post(self, fault_id: str) -> None:
        desk = self.admin_desk()
        fault = desk.book.find(fault_id)
        if fault is None:
            raise web.HTTPError(404, f"No GPU fault {shown(fault_id)}: GET admin/gpu-faults")
        body = self.json_body(("server", "worker", "resume"))
        label, worker = body.get("server"), body.get("worker")
        resume = body.get("resume", False)
        if not isinstance(resume, bool):
            raise web.HTTPError(400, "Field 'resume' must be true or false")
        if not isinstance(label, str) or not label:
            raise web.HTTPError(400, "Field 'server' is required: the server as user/name")
        if worker is not None and not is_worker_name(worker):
            raise web.HTTPError(400, "Field 'worker' must name a worker: w1, w2, ...")
        user_name, _, server_name = label.partition("/")
        user = self.find_user(user_name)
        if user is None or server_name not in user.orm_spawners:
            raise web.HTTPError(404, f"No server {shown(label)}")
        if worker is not None:
            # a worker is not restarted: torchrun's --max-restarts decides the run
            stopped = await user.spawners[server_name].workers.stop(
                f"Its GPU failed ({fault.detail}).", names=[worker], wait=False,
                at=fault.detected_at,
            )  # fmt: skip
            desk.book.note_outcome(fault.id, f"{label}#{worker}", outcome="stopped")
            desk.save()
            self.write_json({"fault": fault.id, "worker": worker, "stopped": stopped}, 202)
            return
        task = asyncio.ensure_future(
            recovery.recover(HandlerHub(self), user, server_name, fault, desk, resume)
        )
        _tasks.add(task)
        task.add_done_callback(_tasks.discard)
        self.write_json({"fault": fault.id, "server": label, "state": "recovering"}, status=202)


class ServerFaultHandler(ServerAPIHandler):
    """A server's Lab extension reports one of its own devices as failing."""

    async def post(self, user_name: str, server_name: str | None) -> None:
        user, spawner = self.find_server(user_name, server_name, "servers")
        body = self.json_body(("device", "kind", "detail"))
        device, kind = body.get("device"), body.get("kind")
        detail = body.get("detail", "")
        record = getattr(spawner, "record", None)
        if record is None or not spawner.active:
            raise web.HTTPError(
                409, "The server is not running: report a fault of a running server's GPU"
            )
        if not isinstance(kind, str) or kind not in REPORTED_KINDS:
            raise web.HTTPError(
                400, f"Field 'kind' must be one of {', '.join(sorted(REPORTED_KINDS))}"
            )
        if not isinstance(detail, str) or len(detail) > 300:
            raise web.HTTPError(400, "Field 'detail' must be text of at most 300 characters")
        # one machine: the hub knows the server's devices; Kubernetes: the device plugin
        # chose them, so any GPU or MIG UUID of a server that holds GPUs
        gpus = spawner.catalog.offering(record.offering).kind != "cpu"
        own = device in record.devices if record.devices else gpus and (
            isinstance(device, str) and DEVICE_ID.fullmatch(device) is not None
        )  # fmt: skip
        if not isinstance(device, str) or not own:
            raise web.HTTPError(
                400,
                "Field 'device' must be the UUID of one of this server's own GPUs (as "
                "NVML in the server names them: GPU-… or MIG-…)",
            )
        desk = faults.desk()
        if desk is None:
            raise web.HTTPError(409, "GPU faults are not acted on here (faults.enabled: false)")
        label = server_label(user.name, server_name or "")
        try:
            accepted = desk.server_report(label, spawner, device, kind, detail, clock.utcnow())
        except BookError as e:
            raise web.HTTPError(409, str(e)) from None
        self.write_json({"accepted": accepted}, status=202)


default_handlers = [
    (rf"/{GPUS_PATH}", GPUsHandler),
    (rf"/{GPUS_PATH}/(.+)/drain", DrainHandler),
    (rf"/{GPUS_PATH}/(.+)/return", ReturnHandler),
    (rf"/{FAULTS_PATH}", FaultsHandler),
    (rf"/{FAULTS_PATH}/([0-9a-f]{{12}})/recover", RecoverHandler),
    (rf"{_SERVER}/gpu-fault", ServerFaultHandler),
]
