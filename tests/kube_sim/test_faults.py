"""Injected faults: 5xx answers with Status bodies, dropped, silent and duplicated watches,
unanswered requests, slow binds."""

import json
import socket
import time
from urllib.parse import urlparse

import pytest
from kubernetes import watch
from kubernetes.client.rest import ApiException
from urllib3.exceptions import MaxRetryError, ReadTimeoutError

from tests.kube_sim import SimulatedCluster
from tests.kube_sim.conftest import pod_body
from tests.kube_sim.rbac import ADMIN_USER
from tests.waiting import wait_for


@pytest.fixture
def cluster():
    with SimulatedCluster.run_in_thread(seed=7) as c:
        yield c


def outcomes(v1, n=200):
    codes = []
    for _ in range(n):
        try:
            v1.list_namespaced_config_map("default")
            codes.append(200)
        except ApiException as e:
            body = json.loads(e.body)
            assert body["kind"] == "Status" and body["code"] == e.status
            assert body["reason"] == "InternalError"
            codes.append(e.status)
    return codes


def test_a_fraction_of_requests_fail_with_status_bodies_reproducibly(cluster, v1):
    cluster.faults.fail_requests(0.3, code=500, verbs=["GET"], path=r"/configmaps")
    first = outcomes(v1)
    failures = first.count(500)
    assert 40 <= failures <= 80, failures  # 30% of 200, give or take
    assert set(first) == {200, 500}
    v1.create_namespaced_config_map("default", {"metadata": {"name": "unaffected"}})  # POST
    cluster.faults.reseed(7)
    assert outcomes(v1) == first  # same seed, same requests: same failures
    cluster.faults.clear()
    assert outcomes(v1, 20) == [200] * 20


def test_dropped_watch_resumes_from_last_resource_version_without_gaps(cluster, v1):
    cluster.faults.drop_watches(after_events=2, after_seconds=1)
    start = v1.list_namespaced_config_map("default").metadata.resource_version
    for i in range(5):
        v1.create_namespaced_config_map("default", {"metadata": {"name": f"cm-{i}"}})
    seen, rv, streams = [], start, 0
    while len(seen) < 5 and streams < 10:
        streams += 1
        for event in watch.Watch().stream(
            v1.list_namespaced_config_map, "default", resource_version=rv, timeout_seconds=5
        ):
            seen.append(event["object"].metadata.name)
            rv = event["object"].metadata.resource_version
    assert seen == [f"cm-{i}" for i in range(5)]
    assert streams == 3  # 2 + 2 + 1 events: every stream was cut short


def test_duplicated_watch_events_arrive_twice_in_order(cluster, v1):
    cluster.faults.duplicate_watch_events()
    start = v1.list_namespaced_config_map("default").metadata.resource_version
    for i in range(3):
        v1.create_namespaced_config_map("default", {"metadata": {"name": f"dup-{i}"}})
    v1.delete_namespaced_config_map("dup-1", "default")
    seen = [
        (event["type"], event["object"].metadata.name, event["object"].metadata.resource_version)
        for event in watch.Watch().stream(
            v1.list_namespaced_config_map, "default", resource_version=start, timeout_seconds=1
        )
    ]
    once = [("ADDED", "dup-0"), ("ADDED", "dup-1"), ("ADDED", "dup-2"), ("DELETED", "dup-1")]
    assert [(t, n) for t, n, _ in seen] == [e for e in once for _ in range(2)]
    assert all(seen[i] == seen[i + 1] for i in range(0, len(seen), 2))  # same rv twice
    assert cluster.faults.duplicated == 4
    cluster.faults.clear()
    again = list(
        watch.Watch().stream(
            v1.list_namespaced_config_map, "default", resource_version=start, timeout_seconds=1
        )
    )
    assert len(again) == 4


def test_slow_binds_delay_scheduling(cluster, v1):
    cluster.add_node("cpu-1")
    cluster.faults.bind_delay = 0.6
    t0 = time.monotonic()
    v1.create_namespaced_pod("default", pod_body("slow"))
    wait_for(lambda: v1.read_namespaced_pod("slow", "default").spec.node_name)
    assert time.monotonic() - t0 >= 0.6


def test_a_silent_watch_sends_nothing_more_and_never_ends(cluster, v1):
    cluster.faults.silence_watches(after_events=2)
    start = v1.list_namespaced_config_map("default").metadata.resource_version
    for i in range(3):
        v1.create_namespaced_config_map("default", {"metadata": {"name": f"quiet-{i}"}})
    seen = []
    t0 = time.monotonic()
    # the watch asks to end after 1 s, but that end is never sent either: only the
    # client's own read timeout (2 s) gets it out
    with pytest.raises(ReadTimeoutError):
        for event in watch.Watch().stream(
            v1.list_namespaced_config_map,
            "default",
            resource_version=start,
            timeout_seconds=1,
            _request_timeout=2,
        ):
            seen.append(event["object"].metadata.name)
    assert seen == ["quiet-0", "quiet-1"]
    assert time.monotonic() - t0 >= 2
    cluster.faults.clear()
    again = watch.Watch().stream(
        v1.list_namespaced_config_map, "default", resource_version=start, timeout_seconds=1
    )
    assert [e["object"].metadata.name for e in again] == ["quiet-0", "quiet-1", "quiet-2"]


def test_a_watch_already_open_goes_silent_and_its_connection_stays_open(cluster, v1):
    start = v1.list_namespaced_config_map("default").metadata.resource_version
    url = urlparse(cluster.url)
    with socket.create_connection((url.hostname, url.port), timeout=5) as sock:
        sock.sendall(
            f"GET /api/v1/namespaces/default/configmaps?watch=true&resourceVersion={start}"
            f"&timeoutSeconds=1 HTTP/1.1\r\nHost: {url.netloc}\r\n"
            f"Authorization: Bearer {cluster.admin_token}\r\n\r\n".encode()
        )
        v1.create_namespaced_config_map("default", {"metadata": {"name": "heard"}})
        received = b""
        while b"heard" not in received:
            received += sock.recv(65536)
        cluster.faults.silence_watches()
        v1.create_namespaced_config_map("default", {"metadata": {"name": "unheard"}})
        sock.settimeout(2)  # past the watch's timeoutSeconds: a live watch would have ended
        with pytest.raises(TimeoutError):  # no data, and no end of stream (b"") either
            received += sock.recv(65536)
        assert b"unheard" not in received


def test_silent_requests_get_no_answer_until_the_fault_is_cleared(cluster, v1):
    cluster.faults.silence_watches(requests=True)
    t0 = time.monotonic()
    # the client retries a read that timed out (3 times), each time on a new connection
    with pytest.raises(MaxRetryError) as failed:
        v1.list_namespaced_config_map("default", _request_timeout=1)
    assert isinstance(failed.value.reason, ReadTimeoutError)
    assert time.monotonic() - t0 >= 4
    cluster.faults.clear()
    assert v1.list_namespaced_config_map("default", _request_timeout=5).kind == "ConfigMapList"


def test_a_silence_for_one_user_leaves_the_others_answered(cluster, v1):
    cluster.faults.silence_watches(requests=True, users=["system:serviceaccount:default:meter"])
    assert v1.list_namespaced_config_map("default", _request_timeout=5).kind == "ConfigMapList"
    cluster.faults.silence_watches(requests=True, users=[ADMIN_USER])
    with pytest.raises(MaxRetryError):
        v1.list_namespaced_config_map("default", _request_timeout=1)
