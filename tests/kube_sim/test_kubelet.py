"""The simulated kubelet: pods run as local processes and report their lifecycle."""

from datetime import UTC, datetime, timedelta

import pytest
from kubernetes.client.rest import ApiException

from tests.kube_sim.conftest import PY, pod_body
from tests.waiting import wait_for


@pytest.fixture(scope="module", autouse=True)
def node(kube):
    kube.add_node("cpu-kubelet", allocatable={"cpu": "64"})


def phase(core, ns, name):
    return core.read_namespaced_pod(name, ns).status.phase


def test_pod_runs_with_its_env_and_its_log_shows_it(core, ns):
    core.create_namespaced_secret(ns, {"metadata": {"name": "tok"}, "stringData": {"t": "s3"}})
    script = (
        "import os,time; print(os.environ['X'], os.environ['T'], os.environ['ME'],"
        " flush=True); time.sleep(30)"
    )
    env = [
        {"name": "X", "value": "hello-gpu"},
        {"name": "T", "valueFrom": {"secretKeyRef": {"name": "tok", "key": "t"}}},
        {"name": "ME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    ]
    core.create_namespaced_pod(ns, pod_body("runner", command=[PY, "-c", script], env=env))
    wait_for(lambda: phase(core, ns, "runner") == "Running")
    pod = core.read_namespaced_pod("runner", ns)
    started = pod.status.container_statuses[0].state.running.started_at
    assert started.tzinfo is not None and started.microsecond == 0
    assert abs((datetime.now(UTC) - started).total_seconds()) < 10
    assert pod.status.container_statuses[0].ready
    assert pod.status.pod_ip != pod.status.host_ip  # its own address on the pod network
    assert {c.type: c.status for c in pod.status.conditions}["Ready"] == "True"
    log = wait_for(lambda: core.read_namespaced_pod_log("runner", ns))
    assert log == "hello-gpu s3 runner\n"
    reasons = [e.reason for e in core.list_namespaced_event(ns).items]
    assert {"Scheduled", "Pulling", "Pulled", "Created", "Started"} <= set(reasons)


def test_deletion_terminates_the_process_and_removes_the_pod(core, ns, tmp_path):
    marker = tmp_path / "pid"
    script = f"import os,time; open({str(marker)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    core.create_namespaced_pod(ns, pod_body("doomed", command=[PY, "-c", script]))
    wait_for(
        lambda: phase(core, ns, "doomed") == "Running" and marker.exists() and marker.read_text()
    )
    pid = int(marker.read_text())
    asked = datetime.now(UTC).replace(microsecond=0)
    deleted = core.delete_namespaced_pod("doomed", ns)
    # Terminating first; as on a real API server, deletionTimestamp = request + grace period
    meta = deleted.metadata
    assert meta.deletion_grace_period_seconds == 30
    requested = meta.deletion_timestamp - timedelta(seconds=meta.deletion_grace_period_seconds)
    assert 0 <= (requested - asked).total_seconds() <= 1
    killing = wait_for(
        lambda: [e for e in core.list_namespaced_event(ns).items if e.reason == "Killing"]
    )
    assert [e.involved_object.name for e in killing] == ["doomed"]
    wait_for(lambda: not core.list_namespaced_pod(ns).items)
    import os

    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    with pytest.raises(ApiException) as e:
        core.read_namespaced_pod("doomed", ns)
    assert e.value.status == 404


def test_a_failing_command_ends_failed_with_its_exit_code(core, ns):
    body = pod_body(
        "crash", command=[PY, "-c", "import sys; print('boom'); sys.exit(1)"], restartPolicy="Never"
    )
    core.create_namespaced_pod(ns, body)
    wait_for(lambda: phase(core, ns, "crash") == "Failed")
    state = core.read_namespaced_pod("crash", ns).status.container_statuses[0].state
    assert state.terminated.exit_code == 1 and state.terminated.reason == "Error"
    assert state.terminated.finished_at >= state.terminated.started_at
    assert core.read_namespaced_pod_log("crash", ns) == "boom\n"


def test_a_command_that_exits_zero_succeeds(core, ns):
    body = pod_body("done", command=[PY, "-c", "pass"], restartPolicy="OnFailure")
    core.create_namespaced_pod(ns, body)
    wait_for(lambda: phase(core, ns, "done") == "Succeeded")
    terminated = core.read_namespaced_pod("done", ns).status.container_statuses[0].state.terminated
    assert (terminated.exit_code, terminated.reason) == (0, "Completed")


def test_restart_policy_always_restarts_with_back_off(core, ns):
    core.create_namespaced_pod(ns, pod_body("flappy", command=[PY, "-c", "raise SystemExit(3)"]))
    status = wait_for(
        lambda: (
            (s := core.read_namespaced_pod("flappy", ns).status).container_statuses
            and s.container_statuses[0].restart_count >= 1
            and s
        )
    )
    assert status.phase == "Running"
    assert status.container_statuses[0].last_state.terminated.exit_code == 3


def test_missing_secret_leaves_the_container_waiting(core, ns):
    env = [{"name": "T", "valueFrom": {"secretKeyRef": {"name": "absent", "key": "t"}}}]
    core.create_namespaced_pod(ns, pod_body("waiting", command=[PY, "-c", "pass"], env=env))
    waiting = wait_for(
        lambda: (
            (s := core.read_namespaced_pod("waiting", ns).status).container_statuses
            and s.container_statuses[0].state.waiting
        )
    )
    wait_for(
        lambda: (
            core.read_namespaced_pod("waiting", ns)
            .status.container_statuses[0]
            .state.waiting.reason
            == "CreateContainerConfigError"
        )
    )
    assert waiting is not None


@pytest.mark.parametrize("minutes", [7, -7])
def test_a_node_clock_ahead_or_behind_skews_what_its_kubelet_writes(kube, core, ns, minutes):
    name = f"cpu-skewed{'-ahead' if minutes > 0 else '-behind'}"
    kube.add_node(name)
    kube.skew_clock(name, timedelta(minutes=minutes))
    body = pod_body(
        "skewed",
        command=[PY, "-c", "import time; time.sleep(0.5)"],
        restartPolicy="Never",
        nodeSelector={"kubernetes.io/hostname": name},
    )
    core.create_namespaced_pod(ns, body)
    wait_for(lambda: phase(core, ns, "skewed") == "Succeeded")
    pod = core.read_namespaced_pod("skewed", ns)
    created = pod.metadata.creation_timestamp  # the API server's clock

    def off(when):
        return (when - created).total_seconds() / 60

    terminated = pod.status.container_statuses[0].state.terminated
    assert round(off(terminated.started_at)) == minutes
    assert round(off(terminated.finished_at)) == minutes
    assert round(off(pod.status.start_time)) == minutes
    events = {e.reason: e for e in core.list_namespaced_event(ns).items}
    assert round(off(events["Started"].last_timestamp)) == minutes  # the kubelet's
    assert round(off(events["Scheduled"].last_timestamp)) == 0  # the scheduler's


def test_a_command_that_does_not_exist_fails_to_start(core, ns):
    # checked before the pod's network prefix runs it, as the runtime's exec would fail
    body = pod_body("nocmd", command=["/nonexistent/server"], restartPolicy="Never")
    core.create_namespaced_pod(ns, body)
    wait_for(lambda: phase(core, ns, "nocmd") == "Failed")
    terminated = core.read_namespaced_pod("nocmd", ns).status.container_statuses[0].state.terminated
    assert (terminated.exit_code, terminated.reason) == (128, "StartError")
    assert terminated.message == (
        "failed to start container: exec: /nonexistent/server: No such file or directory"
    )
