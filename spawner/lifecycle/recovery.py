"""Recovering a server from a GPU fault (docs/gpu-faults.md, data flow 4–7 of
docs/design-gpu-faults.md): billing closed at the detection second, the user told, the server
stopped after the grace and started again on a healthy GPU, first in line.

It runs in a hub request handler (spawner/api/gpus.py), as a change of GPU does, so its stop
and start go through JupyterHub's own machinery (:class:`~.change.HandlerHub`).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from gputap_common import clock
from gputap_common.names import server_label

from ..core.health import Fault
from . import change as changes
from . import placing, stops
from .faults import FaultDesk

log = logging.getLogger("gputap.faults")

#: how long a recovery waits for the hub's start-up check of its server (below)
CHECK_WAIT_SECONDS = 120.0
CHECK_STEP_SECONDS = 0.2


async def recover(
    hub: Any, user: Any, server_name: str, fault: Fault, desk: FaultDesk, resume: bool = False
) -> None:
    """Recover ``user``'s server from ``fault`` (data flow 4–7 of docs/design-gpu-faults.md):
    close billing at the detection second, tell, stop after the grace, start again.

    ``resume``: a recovery a hub restart cut short (the book says it was stopping or
    waiting): a server still running is recovered from the start, a stopped one started."""
    label = server_label(user.name, server_name)
    spawner = hub.spawner(user, server_name)
    if spawner is None:
        return
    await _checked(spawner)
    if label in desk.recovering:
        # already being moved off a failed GPU (another of its GPUs, or another report)
        desk.book.note_outcome(fault.id, label, outcome="moved", by=desk.recovering[label])
        desk.save()
        return
    record = getattr(spawner, "record", None)
    facts = _facts(desk, fault, label)
    if resume and record is not None and facts.get("session_id") not in (None, record.session_id):
        # the last hub had started it again before it died: it runs on a healthy GPU
        desk.book.note_outcome(fault.id, label, outcome="running")
        desk.save()
        return
    desk.recovering[label] = fault.id
    try:
        if record is not None and spawner.active and not spawner.pending:
            await _recover(hub, user, server_name, fault, desk, spawner, record)
        elif resume and not spawner.active and not spawner.pending:
            await _resume_start(hub, user, server_name, fault, desk, spawner)
        else:
            desk.book.note_outcome(fault.id, label, outcome="not running")
    finally:
        desk.recovering.pop(label, None)
        desk.save()


async def _checked(spawner: Any) -> None:
    """Wait for the hub's start-up check of the server: past ``init_spawners_timeout`` a
    hub under load finishes checking the servers it found running in the background, the
    spawner pending "check" meanwhile; what the check finds (running, or stopped while no hub
    ran) decides the recovery. JupyterHub signals the check's end only by the flag."""
    deadline = asyncio.get_running_loop().time() + CHECK_WAIT_SECONDS
    while spawner.pending == "check" and asyncio.get_running_loop().time() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(CHECK_STEP_SECONDS)


def _facts(desk: FaultDesk, fault: Fault, label: str) -> dict[str, Any]:
    """What the book says of ``label``'s recovery from ``fault``."""
    return next((o for o in desk.book.outcomes.get(fault.id, []) if o["server"] == label), {})


async def _resume_start(
    hub: Any, user: Any, server_name: str, fault: Fault, desk: FaultDesk, spawner: Any
) -> None:
    label = server_label(user.name, server_name)
    facts = _facts(desk, fault, label)
    if facts.get("outcome") == "stopping" and (
        refusal := desk.restart_refusal(label, clock.utcnow())
    ):
        desk.book.note_outcome(fault.id, label, outcome="not restarted", why=refusal)
        return
    desk.book.note_outcome(fault.id, label, outcome="waiting", restarted=True)
    change = _change(user.name, server_name, facts.get("offering", ""))
    options = {k: v for k, v in (spawner.user_options or {}).items() if k != "queue"}
    log.info("%s: resuming its recovery from GPU fault %s after a hub restart", label, fault.id)
    await _start_again(
        hub, user, server_name, fault, desk, change, options,
        facts.get("offering", ""), int(facts.get("count") or 1),
    )  # fmt: skip


def _change(user_name: str, server_name: str, offering: str) -> changes.Change:
    change = changes.Change(
        user=user_name,
        server=server_name,
        reason="fault",
        from_key=offering,
        to_key=offering,
        state=changes.STOPPING,
        message="",
        started_at=clock.utcnow(),
    )
    changes.track(change)
    return change


async def _recover(
    hub: Any, user: Any, server_name: str, fault: Fault, desk: FaultDesk, spawner, record
) -> None:
    label = server_label(user.name, server_name)
    book = desk.book
    detected = fault.detected_at
    started = record.started_at
    billed_until = max(detected, started) if started else detected
    # billing first: the session ends at the detection second whatever comes next (when
    # billing is down, Metering retries in the background with the same end)
    await spawner.metering.close(record.session_id, billed_until)
    refusal = desk.restart_refusal(label, clock.utcnow())
    then = stops.fault_next(refusal is None, refusal or "")
    reason = stops.by_fault(fault.detail, then)(detected)
    book.note_outcome(
        fault.id,
        label,
        outcome="stopping",
        session_id=record.session_id,
        billed_until=billed_until.isoformat(),
        offering=record.offering,
        count=record.count,
    )
    desk.save()
    options = {k: v for k, v in (spawner.user_options or {}).items() if k != "queue"}
    change = _change(user.name, server_name, record.offering)
    change.set(changes.STOPPING, f"GPU fault ({fault.detail}): stopping the server")
    # told now; stopped after the grace, so Lab saves open documents (billing already ended);
    # a busy server may take the grace to hear it
    grace = float(desk.settings["save_grace_seconds"])
    loop = asyncio.get_running_loop()
    told_by = loop.time() + grace
    await spawner.tell_why(reason, wait_seconds=max(stops.ANNOUNCE_TIMEOUT_SECONDS, grace))
    await asyncio.sleep(max(0.0, told_by - loop.time()))
    if not spawner.active or spawner.record is not record:
        # stopped in the grace (by its user, the culler): its stop settled it; not restarted
        change.set(changes.DONE, "The server was stopped during the fault's grace.")
        book.note_outcome(fault.id, label, outcome="stopped")
        return
    spawner.stop_book.next_because(lambda _at: reason, billed_until=billed_until)
    try:
        await hub.stop(user, server_name)
    except Exception as e:
        spawner.stop_book.next_because(None)  # not this stop's: a later one bills to its own end
        why = changes.reason_of(e)
        change.set(changes.FAILED, f"The server could not be stopped ({why}).")
        book.note_outcome(fault.id, label, outcome="failed", why=why)
        return
    if refusal is not None:
        change.set(changes.FAILED, f"Not started again: {refusal}.")
        book.note_outcome(fault.id, label, outcome="not restarted", why=refusal)
        return
    book.note_outcome(fault.id, label, outcome="waiting", restarted=True)
    desk.save()
    await _start_again(
        hub, user, server_name, fault, desk, change, options, record.offering, record.count
    )


async def _start_again(
    hub: Any,
    user: Any,
    server_name: str,
    fault: Fault,
    desk: FaultDesk,
    change: changes.Change,
    options: dict[str, Any],
    offering: str,
    count: int,
) -> None:
    """Start the server again, first in line, on its options (or a similar free GPU)."""
    label = server_label(user.name, server_name)
    book, detected = desk.book, fault.detected_at
    spawner = hub.spawner(user, server_name)
    options = changes.with_environment_kept({**options, "queue": True}, spawner.user_options)
    change.set(changes.STARTING, "starting the server again on a healthy GPU")
    placing.front.add(label)
    try:
        similar = await _similar(desk, spawner, options, offering, count)
        if similar is None or not await _started_on(change, hub, user, similar):
            await changes.start_following_queue(change, hub, user, options)
    except Exception as e:
        why = changes.reason_of(e)
        change.set(
            changes.FAILED,
            f"The server did not start again ({why}). Start it from the hub's home page; "
            "your files are kept.",
        )
        book.note_outcome(fault.id, label, outcome="failed", why=why)
        spawner = hub.spawner(user, server_name)
        if spawner is not None:
            failed = stops.fault_next(False, f"starting it again failed ({why})")
            spawner.stop_book.set(stops.by_fault(fault.detail, failed)(detected))
        return
    finally:
        placing.front.discard(label)
    new_record = hub.spawner(user, server_name).record
    change.to_key = new_record.offering if new_record else change.to_key
    where = ", ".join(new_record.devices) if new_record and new_record.devices else "its node"
    change.set(changes.DONE, f"Running again on a healthy GPU ({where}) after a GPU fault.")
    book.note_outcome(
        fault.id,
        label,
        outcome="running",
        new_session_id=new_record.session_id if new_record else None,
        devices=list(new_record.devices) if new_record else [],
    )


async def _similar(
    desk: FaultDesk, spawner: Any, options: dict[str, Any], offering_key: str, count: int
) -> dict[str, Any] | None:
    """The options of the cheapest free GPU at least as large (memory, FP16 TFLOPS) as the
    failed one, when the user allowed it in advance (``on_fault: similar``), the operator
    allows it (``faults.restart: allowed``) and the same is not free now; else None."""
    if desk.settings["restart"] != "allowed" or options.get("on_fault") != "similar":
        return None
    view, _ = await spawner.gpu_free_view()
    if view.max_free(offering_key) >= count:
        return None
    offering = spawner.catalog.offering(offering_key)
    if offering.kind == "cpu":
        return None
    kept = {k: v for k, v in options.items() if k in ("course", "environment", "image", "spot")}
    return {
        **kept,
        "kind": "spec",
        "min_memory_gb": offering.memory_gb,
        "min_tflops": offering.fp16_tflops,
        "count": count,
        "on_fault": "similar",
    }


async def _started_on(change: changes.Change, hub: Any, user: Any, options: dict) -> bool:
    """Start on ``options`` without waiting in line; False (logged) when that fails."""
    try:
        await hub.start(user, change.server, options)
    except Exception as e:
        log.info("%s: no similar GPU free (%s); waiting for the same", change.who, e)
        return False
    return True
