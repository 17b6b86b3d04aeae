"""GPU faults on one machine (docs/gpu-faults.md): a fault injected on the device of a running
server takes the device out of the pool, ends the billing session at the detection second,
and the server runs again on another device with its files; no later spawn lands on the
faulty device until an admin returns it; an application XID changes nothing; a fault on a
free device only takes it out; past the restart limit the server stays stopped, told why.

The faults are the simulated inventory's (``fault:`` entries, as the fake NVML's are NVML's:
tests/nvml/test_nvml_health.py), read by the hub's real watcher.
"""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path

import pytest
import requests
import yaml

from tests.platform import Platform

T4 = {"kind": "card", "card": "T4"}
GPUS = [{"card": "T4"}, {"card": "T4"}, {"card": "T4"}, {"card": "RTX-4090"}]


def parse(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def write_inventory(path: Path, faults: dict[int, dict], cards: list[dict] = GPUS) -> None:
    gpus = [{**gpu, **({"fault": faults[i]} if i in faults else {})} for i, gpu in enumerate(cards)]
    path.write_text(yaml.safe_dump({"node": "workstation", "gpus": gpus}))


class Machine:
    """The platform, and the simulated GPUs' faults as a machine's state."""

    def __init__(self, root: Path, cards: list[dict] = GPUS, **faults_settings):
        self.inventory = root / "inventory.yaml"
        self.faults: dict[int, dict] = {}
        self.cards = cards
        write_inventory(self.inventory, {}, cards)
        self.platform = Platform(
            root,
            extra={
                "hub": {"admin_users": ["root"]},
                "spawner": {"inventory": "file", "inventory_file": str(self.inventory)},
                "faults": {"poll_seconds": 0.5, "save_grace_seconds": 1, **faults_settings},
            },
        )

    def inject(self, index: int, fault: dict) -> float:
        """A fault on GPU ``index``; when it was injected (epoch seconds)."""
        self.faults[index] = fault
        at = time.time()
        write_inventory(self.inventory, self.faults, self.cards)
        return at

    def api(self, path: str, method: str = "GET", body=None) -> requests.Response:
        return self.platform.api.request(
            method, f"{self.platform.url}/hub/gputap/api/{path}", json=body, timeout=60
        )

    def devices(self) -> list[dict]:
        r = self.api("admin/gpus")
        assert r.status_code == 200, r.text
        return r.json()["devices"]

    def device(self, index: int) -> dict:
        return next(d for d in self.devices() if d["label"].startswith(f"GPU {index}:"))

    def device_by_id(self, device_id: str) -> dict:
        return next(d for d in self.devices() if d["id"] == device_id)

    def held_by(self, holder: str) -> dict:
        return next(d for d in self.devices() if d["held_by"] == holder)

    def faults_seen(self) -> list[dict]:
        r = self.api("admin/gpu-faults")
        assert r.status_code == 200, r.text
        return r.json()["faults"]

    def wait_for(self, predicate, timeout: float = 60, step: float = 0.25):
        return self.platform.wait_for(predicate, timeout=timeout, step=step)


@pytest.fixture(scope="module")
def machine(tmp_path_factory):
    m = Machine(tmp_path_factory.mktemp("gpu-faults"))
    m.platform.start()
    yield m
    m.platform.shutdown()


def user_api(platform, token: str, path: str, method: str = "GET", body=None):
    return requests.request(
        method,
        f"{platform.url}/hub/gputap/api/{path}",
        headers={"Authorization": f"token {token}"},
        json=body,
        timeout=60,
    )


def contents(platform, token: str, name: str, path: str, text: str | None = None):
    url = f"{platform.url}/user/{name}/api/contents/{path}"
    headers = {"Authorization": f"token {token}"}
    if text is None:
        return requests.get(url, headers=headers, timeout=30)
    body = {"type": "file", "format": "text", "content": text}
    return requests.put(url, headers=headers, json=body, timeout=30)


def test_a_fault_on_a_running_servers_gpu_moves_it_and_ends_billing_at_that_second(machine):
    p = machine.platform
    p.create_user("alice")
    token = p.user_token("alice")
    assert p.spawn("alice", T4).status_code in (201, 202)
    p.wait_ready("alice")
    assert contents(p, token, "alice", "work.txt", "epoch 7").status_code in (200, 201)
    first = machine.held_by("alice")
    index = int(first["label"].split()[1].rstrip(":"))
    [session] = p.sessions("alice")

    injected = machine.inject(index, {"xid": 79})
    out = machine.wait_for(lambda: machine.device(index)["state"] == "faulty" and time.time())
    assert out - injected <= 5, "out of the pool within 5 s on one machine"
    [fault] = [f for f in machine.faults_seen() if first["id"] in f["devices"]]
    assert fault["kind"] == "xid" and "XID 79" in fault["detail"]
    detected = parse(fault["detected_at"])

    # billing ended at the detection second
    def ended():
        s = next(s for s in p.sessions("alice") if s["id"] == session["id"])
        return s if s["state"] == "ended" else None

    closed = machine.wait_for(ended)
    assert abs(parse(closed["ended_at"]) - detected) <= 1, (closed, fault)

    # the server runs again, elsewhere, with its files and a session of its own
    def running_again():
        r = user_api(p, token, "users/alice/server")
        view = r.json()
        change = view.get("change") or {}
        return view if view["running"] and change.get("state") == "done" else None

    view = machine.wait_for(running_again, timeout=90)
    assert view["change"]["reason"] == "fault"
    second = machine.held_by("alice")
    assert second["id"] != first["id"] and second["offering"] == "T4"
    r = contents(p, token, "alice", "work.txt")
    assert r.status_code == 200 and r.json()["content"] == "epoch 7"
    sessions = p.sessions("alice")
    new = next(s for s in sessions if s["id"] != session["id"])
    assert parse(new["started_at"]) >= detected
    # the hub's page tells it: the stop reason kept on the spawner (kind fault)
    outcomes = {s["server"]: s for s in machine.faults_seen()[0]["servers"]}
    assert outcomes["alice"]["outcome"] == "running"

    # no later spawn lands on the faulty device while it is out
    p.create_user("bob")
    assert p.spawn("bob", T4).status_code in (201, 202)
    p.wait_ready("bob")
    assert machine.held_by("bob")["id"] != first["id"]
    p.create_user("carol")
    p.spawn("carol", T4)  # the third T4 is the faulty one: nothing is free, it is refused
    time.sleep(3)
    assert machine.device(index)["held_by"] is None
    assert not (p.server("carol") or {}).get("ready")

    # an admin returns it: a drain or return by a user is refused
    bob = p.user_token("bob")
    denied = user_api(p, bob, f"admin/gpus/{first['id']}/return", "POST", {})
    assert denied.status_code == 403
    # while the machine still shows the fault, the GPU cannot be returned
    early = machine.api(f"admin/gpus/{first['id']}/return", "POST", {})
    assert early.status_code == 409 and "still declares a fault" in early.json()["message"]
    machine.faults.pop(index)
    write_inventory(machine.inventory, machine.faults)
    back = machine.api(f"admin/gpus/{first['id']}/return", "POST", {"note": "reseated"})
    assert back.status_code == 200, back.text
    assert machine.device(index)["state"] == "healthy"
    # returned, it may fail again the same way, and is taken out again
    machine.inject(index, {"xid": 79})
    machine.wait_for(lambda: machine.device(index)["state"] == "faulty", timeout=10)
    machine.faults.pop(index)
    write_inventory(machine.inventory, machine.faults)
    assert machine.api(f"admin/gpus/{first['id']}/return", "POST", {}).status_code == 200
    p.stop_server("bob")
    p.stop_server("alice")


def test_an_application_xid_changes_nothing(machine):
    p = machine.platform
    p.create_user("dora")
    p.user_token("dora")
    assert p.spawn("dora", T4).status_code in (201, 202)
    p.wait_ready("dora")
    held = machine.held_by("dora")
    index = int(held["label"].split()[1].rstrip(":"))
    before = len(machine.faults_seen())
    machine.inject(index, {"xid": 13})
    time.sleep(3)  # six polls
    assert machine.device(index)["state"] == "healthy"
    assert machine.held_by("dora")["id"] == held["id"]
    assert len(machine.faults_seen()) == before
    [session] = p.sessions("dora")
    assert session["state"] == "running"
    machine.faults.pop(index)
    write_inventory(machine.inventory, machine.faults)
    p.stop_server("dora")


def test_a_fault_on_a_free_gpu_only_takes_it_out(machine):
    free = next(d for d in machine.devices() if d["state"] == "healthy" and not d["held_by"])
    index = int(free["label"].split()[1].rstrip(":"))
    machine.inject(index, {"lost": True})
    machine.wait_for(lambda: machine.device(index)["state"] == "faulty", timeout=10)
    fault = next(f for f in machine.faults_seen() if free["id"] in f["devices"])  # newest
    assert fault["kind"] == "lost" and fault["servers"] == []
    drained = machine.api(f"admin/gpus/{free['id']}/drain", "POST", {})
    assert drained.status_code == 409 and "return it instead" in drained.json()["message"]
    unknown = machine.api("admin/gpus/GPU-nope/return", "POST", {})
    assert unknown.status_code == 404


def test_past_the_restart_limit_the_server_stays_stopped_and_says_why(tmp_path):
    m = Machine(tmp_path, max_restarts=0)
    p = m.platform
    p.start()
    try:
        p.create_user("erin")
        token = p.user_token("erin")
        assert p.spawn("erin", T4).status_code in (201, 202)
        p.wait_ready("erin")
        index = int(m.held_by("erin")["label"].split()[1].rstrip(":"))
        m.inject(index, {"ecc": 2})
        p.wait_stopped("erin", timeout=30)
        stop = user_api(p, token, "users/erin/server").json()["stop"]
        assert stop["kind"] == "fault"
        assert "not started again" in stop["todo"]
        # the next spawn form says so, and the hub's home page (its servers, read live)
        form = p.login("erin").get(f"{p.url}/hub/spawn", timeout=30).text
        assert "The GPU of your server failed at" in form
        servers = user_api(p, token, "running").json()["servers"]
        assert "The GPU of your server failed at" in servers[0]["notice"]
        time.sleep(2)
        assert p.server("erin") is None or not p.server("erin").get("ready")
    finally:
        p.shutdown()


def test_with_nothing_free_the_moved_server_waits_first_in_line(tmp_path):
    m = Machine(tmp_path)
    p = m.platform
    p.start()
    try:
        tokens = {}
        for name in ("ann", "ben", "cat"):
            p.create_user(name)
            tokens[name] = p.user_token(name)
            assert p.spawn(name, T4).status_code in (201, 202)
            p.wait_ready(name)
        # every T4 is taken: dan waits in line before the fault
        p.create_user("dan")
        assert p.spawn("dan", {**T4, "queue": True}).status_code == 202
        index = int(m.held_by("ann")["label"].split()[1].rstrip(":"))
        m.inject(index, {"xid": 79})

        def waiting_first():
            change = user_api(p, tokens["ann"], "users/ann/server").json().get("change") or {}
            return change.get("state") == "waiting" and "1st in queue" in change["message"]

        m.wait_for(waiting_first, timeout=30)
        p.stop_server("ben")  # ann, ahead of dan, gets ben's T4
        m.wait_for(
            lambda: (
                (user_api(p, tokens["ann"], "users/ann/server").json().get("change") or {}).get(
                    "state"
                )
                == "done"
            ),
            timeout=60,
        )
        assert not (p.server("dan") or {}).get("ready")
        p.stop_server("cat")
        p.wait_ready("dan", timeout=60)
    finally:
        p.shutdown()


def test_a_server_reports_only_its_own_gpus(machine):
    p = machine.platform
    p.create_user("hal")
    token = p.user_token("hal")
    assert p.spawn("hal", T4).status_code in (201, 202)
    p.wait_ready("hal")
    own = machine.held_by("hal")["id"]
    other = next(d["id"] for d in machine.devices() if d["id"] != own)
    path = "users/hal/server/gpu-fault"
    body = {"device": other, "kind": "lost", "detail": "x"}
    refused = user_api(p, token, path, "POST", body)
    assert refused.status_code == 400 and "own GPUs" in refused.json()["message"]
    bad = user_api(p, token, path, "POST", {"device": own, "kind": "boom"})
    assert bad.status_code == 400 and "kind" in bad.json()["message"]
    # another user cannot report on hal's server: it does not exist for them
    p.create_user("ivy")
    assert user_api(p, p.user_token("ivy"), path, "POST", body).status_code == 404
    # one machine: the hub reads NVML itself; a report alone takes nothing out
    accepted = user_api(p, token, path, "POST", {"device": own, "kind": "lost"})
    assert accepted.status_code == 202 and accepted.json() == {"accepted": False}
    time.sleep(1.5)
    assert machine.held_by("hal")["state"] == "healthy"
    p.stop_server("hal")


def test_a_recovery_cut_short_by_a_hub_killed_is_finished_by_the_next_hub(tmp_path):
    m = Machine(tmp_path, save_grace_seconds=4)
    p = m.platform
    p.start()
    try:
        p.create_user("jo")
        token = p.user_token("jo")
        assert p.spawn("jo", T4).status_code in (201, 202)
        p.wait_ready("jo")
        first = m.held_by("jo")
        [session] = p.sessions("jo")
        m.inject(int(first["label"].split()[1].rstrip(":")), {"xid": 79})

        def stopping():
            for fault in m.faults_seen():
                if any(s["outcome"] == "stopping" for s in fault["servers"]):
                    return fault
            return None

        fault = m.wait_for(stopping, timeout=15, step=0.1)
        p.proc.kill()  # kill -9 during the grace: the server still runs on the broken GPU
        p.proc.wait()
        p.start()
        view = m.wait_for(running_again(p, token, "jo"), timeout=90)
        assert view["change"]["reason"] == "fault"
        assert m.held_by("jo")["id"] != first["id"]
        closed = next(s for s in p.sessions("jo") if s["id"] == session["id"])
        assert abs(parse(closed["ended_at"]) - parse(fault["detected_at"])) <= 1
        [fault] = [f for f in m.faults_seen() if f["id"] == fault["id"]]
        assert fault["servers"][0]["outcome"] == "running"
    finally:
        p.shutdown()


def running_again(platform, token: str, user: str):
    def done():
        view = user_api(platform, token, f"users/{user}/server").json()
        change = view.get("change") or {}
        return view if view["running"] and change.get("state") == "done" else None

    return done


def test_the_tours_fault_on_the_only_mig_card_waits_for_its_return_then_starts_again(tmp_path):
    """README tour step 6: a fault on the card of the tour's 1g.10gb slice takes the whole
    card out; the server waits first in line for a slice (none is left healthy) instead of
    failing as if the platform had none, and starts again on one when the card is back."""
    cards = [{"card": "A100-80GB", "mig": ["1g.10gb", "1g.10gb"]}, {"card": "T4"}]
    m = Machine(tmp_path, cards=cards)
    p = m.platform
    p.start()
    try:
        p.create_user("tia")
        token = p.user_token("tia")
        slice_ = {"kind": "slice", "card": "A100-80GB", "profile": "1g.10gb"}
        assert p.spawn("tia", slice_).status_code in (201, 202)
        p.wait_ready("tia")
        first = m.held_by("tia")
        m.inject(0, {"xid": 79})

        def change():
            return user_api(p, token, "users/tia/server").json().get("change") or {}

        waiting = m.wait_for(lambda: change().get("state") == "waiting" and change(), timeout=30)
        assert "1st in queue" in waiting["message"], waiting
        assert "has no" not in waiting["message"], waiting
        # an admin returns the card once the machine no longer declares the fault
        m.faults.pop(0)
        write_inventory(m.inventory, m.faults, cards)
        slices = [d for d in m.devices() if d["label"].startswith("GPU 0:")]
        assert {d["state"] for d in slices} == {"faulty"}
        # one Return brings back all the card's fault took out
        back = m.api(f"admin/gpus/{slices[-1]['id']}/return", "POST", {})
        assert back.status_code == 200, back.text
        assert {m.device_by_id(d["id"])["state"] for d in slices} == {"healthy"}
        # and nothing else of that fault is left listed out of service (the card itself)
        assert [d for d in m.devices() if d["state"] != "healthy"] == []
        m.wait_for(lambda: change().get("state") == "done", timeout=60)
        assert m.held_by("tia")["offering"] == first["offering"]
    finally:
        p.shutdown()
