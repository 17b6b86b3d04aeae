"""The server's check of its own GPUs for faults (gputap_lab/health.py): what it finds, what
``GET gputap/gpu-health`` answers, and what reaches the hub's ``POST {server}/gpu-fault``.

The findings' rules without NVML first; then a real server reading tests/nvml's fake
libnvidia-ml, reporting to tests/lab/fake_hub.py.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest

from gputap_lab.health import HealthState, Reading
from tests.lab.conftest import hub_env
from tests.lab.test_nvml_reader import H200, MACHINE, SLICE_1G, nvml_env
from tests.nvml.conftest import HERE as NVML_DIR
from tests.nvml.conftest import fake_nvml_dir, write_machine  # noqa: F401

T0 = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)
LOST_DETAIL = "NVML answers: GPU is lost"
# the fake answers ECC and row remapping once it has them (docs/design-gpu-faults.md)
FAKE_HAS_COUNTERS = "nvmlDeviceGetRemappedRows" in (NVML_DIR / "fake_nvml.c").read_text()


def check(state: HealthState, *readings: Reading, after: int = 0):
    return state.update(list(readings), T0 + timedelta(seconds=after))


# -- the rules, without NVML -------------------------------------------------------------


def test_ecc_errors_count_from_the_first_reading_and_are_found_once():
    state = HealthState()
    # errors from before this server started are not a fault of it
    assert check(state, Reading("GPU-1", ecc_uncorrected=4)) == []
    assert check(state, Reading("GPU-1", ecc_uncorrected=4), after=3) == []
    [finding] = check(state, Reading("GPU-1", ecc_uncorrected=6), after=6)
    assert finding.to_json() == {
        "device": "GPU-1",
        "kind": "ecc",
        "detail": "2 uncorrected ECC error(s) since this server started (volatile count 4 -> 6)",
    }
    assert check(state, Reading("GPU-1", ecc_uncorrected=9), after=9) == []
    assert state.device_view(Reading("GPU-1", ecc_uncorrected=9)) == {
        "uuid": "GPU-1",
        "healthy": False,
        "kind": "ecc",
        "detail": finding.detail,
    }


def test_a_volatile_count_that_starts_again_is_compared_from_there():
    state = HealthState()
    check(state, Reading("GPU-1", ecc_uncorrected=5))
    assert check(state, Reading("GPU-1", ecc_uncorrected=0), after=3) == []
    [finding] = check(state, Reading("GPU-1", ecc_uncorrected=1), after=6)
    assert finding.detail.startswith("1 uncorrected ECC error(s)")


def test_remap_failure_and_lost_gpu_are_findings_that_never_clear():
    state = HealthState()
    assert check(state, Reading("GPU-1", remap_failed=False), Reading("GPU-2")) == []
    found = check(state, Reading("GPU-1", remap_failed=True), Reading("GPU-2", lost="GPU is lost"))
    assert [(f.device, f.kind) for f in found] == [("GPU-1", "remap"), ("GPU-2", "lost")]
    assert found[1].detail == LOST_DETAIL
    # the GPU answers again: it is not repaired, and nothing is found a second time
    assert check(state, Reading("GPU-1", remap_failed=True), Reading("GPU-2"), after=3) == []
    assert [state.device_view(r)["healthy"] for r in state.readings] == [False, False]


def test_a_device_not_checked_this_time_says_why():
    state = HealthState()
    check(state, Reading("GPU-1", error="Unknown Error"))
    assert state.device_view(state.readings[0]) == {
        "uuid": "GPU-1",
        "healthy": True,
        "detail": "not checked this time: Unknown Error",
    }


# -- a real server, the fake NVML, the fake hub -------------------------------------------


@pytest.fixture
def hub_state(hub):
    state, url = hub
    state.seen.clear()
    state.fail_next = None
    state.servers = {"", "gpu1"}
    return state, url


def health(server) -> dict:
    answer = server.get("gputap/gpu-health")
    assert answer.status_code == 200, answer.text
    return answer.json()


def wait_for_health(server, check, seconds: float = 10) -> dict:
    deadline = time.monotonic() + seconds
    answer: dict = {}
    while time.monotonic() < deadline:
        answer = health(server)
        if check(answer):
            return answer
        time.sleep(0.1)
    raise AssertionError(f"not in {seconds} s: {answer}\n{server.log()[-4000:]}")


def reports(state) -> list:
    return [seen for seen in state.seen if seen.path.endswith("/gpu-fault")]


def fault_server(lab_server, fake_dir, hub_state, machine, visible: str, name: str = ""):
    state, url = hub_state
    env = {
        **hub_env(state, url, name),
        **nvml_env(fake_dir, visible, FAKE_NVML_FILE=str(machine)),
    }
    return lab_server(None, env=env)


def test_a_lost_gpu_is_shown_and_reported_once(
    lab_server,
    fake_nvml_dir,  # noqa: F811
    hub_state,
    tmp_path,
):
    state, _ = hub_state
    machine = tmp_path / "machine"
    write_machine(machine, DEVICES=MACHINE, USE=f"{H200}|40|1000|1")
    server = fault_server(lab_server, fake_nvml_dir, hub_state, machine, H200)
    answer = wait_for_health(server, lambda a: a["checked_at"] is not None)
    # a driver without the ECC and remapping calls is not checked for them, quietly
    assert answer["devices"] == [{"uuid": H200, "healthy": True}]
    assert answer["message"] is None
    assert reports(state) == []

    # the hub does not answer the first report (a proxy's error page): tried again
    state.fail_next = (502, "<html>Bad Gateway</html>")
    write_machine(machine, DEVICES=MACHINE, FAIL_CALLS=f"*@{H200}=GPU_IS_LOST")
    answer = wait_for_health(server, lambda a: not a["devices"][0]["healthy"])
    assert answer["devices"] == [
        {"uuid": H200, "healthy": False, "kind": "lost", "detail": LOST_DETAIL}
    ]
    deadline = time.monotonic() + 10
    while len(reports(state)) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(1)  # five more samples: nothing more is reported
    sent = reports(state)
    assert [(s.method, s.path, s.authorized) for s in sent] == [
        ("POST", "/hub/gputap/api/users/alice/server/gpu-fault", True)
    ] * 2
    assert sent[-1].body == {"device": H200, "kind": "lost", "detail": LOST_DETAIL}
    log = server.log()
    assert log.count("not reported yet") == 1, log
    assert "reported to the hub" in log
    assert state.token not in log

    # the GPU answers again: a fault never clears by itself
    write_machine(machine, DEVICES=MACHINE, USE=f"{H200}|40|1000|1")
    time.sleep(1)
    assert health(server)["devices"][0]["healthy"] is False
    assert len(reports(state)) == 2


def test_a_named_servers_slice_reports_to_its_own_path_and_a_refusal_is_not_repeated(
    lab_server,
    fake_nvml_dir,  # noqa: F811
    hub_state,
    tmp_path,
):
    state, _ = hub_state
    machine = tmp_path / "machine"
    write_machine(machine, DEVICES=MACHINE, FAIL_CALLS=f"*@{SLICE_1G}=GPU_IS_LOST")
    state.fail_next = (400, "<html>not yours</html>")
    server = fault_server(lab_server, fake_nvml_dir, hub_state, machine, SLICE_1G, "gpu1")
    wait_for_health(server, lambda a: a["devices"] and not a["devices"][0]["healthy"])
    time.sleep(1)
    sent = reports(state)
    assert [(s.path, s.body["device"], s.body["kind"]) for s in sent] == [
        ("/hub/gputap/api/users/alice/servers/gpu1/gpu-fault", SLICE_1G, "lost")
    ]
    assert "the hub refused the GPU fault report" in server.log()


@pytest.mark.skipif(not FAKE_HAS_COUNTERS, reason="this tree's fake NVML has no ECC or REMAP")
def test_ecc_errors_and_a_failed_remap_are_reported(
    lab_server,
    fake_nvml_dir,  # noqa: F811
    hub_state,
    tmp_path,
):
    state, _ = hub_state
    machine = tmp_path / "machine"
    write_machine(machine, DEVICES=MACHINE, ECC=f"{H200}|1|7", REMAP=f"{H200}|0|0|0|0")
    server = fault_server(lab_server, fake_nvml_dir, hub_state, machine, H200)
    wait_for_health(server, lambda a: a["checked_at"] is not None)
    write_machine(machine, DEVICES=MACHINE, ECC=f"{H200}|3|9", REMAP=f"{H200}|0|1|0|1")
    deadline = time.monotonic() + 10
    while len(reports(state)) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert sorted((s.body["kind"], s.body["detail"]) for s in reports(state)) == [
        ("ecc", "2 uncorrected ECC error(s) since this server started (volatile count 1 -> 3)"),
        ("remap", "row remapping failed: a bad memory row could not be remapped"),
    ]
    assert health(server)["devices"][0]["kind"] == "ecc"


def test_the_route_needs_login_and_says_when_nothing_is_checked(lab_server, hub_state):
    state, url = hub_state
    server = lab_server(None, env=hub_env(state, url))  # a simulated card
    assert server.get("gputap/gpu-health", auth=False).status_code == 403
    assert health(server) == {
        "checked_at": None,
        "message": "simulated card: no live numbers",
        "devices": [],
    }
