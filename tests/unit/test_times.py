"""Node clock offsets (gputap_common/times.py): a node minutes off is corrected, a healthy one
whose kubelet took the pod a second or two after binding is not."""

from datetime import timedelta

import pytest

from gputap_common.times import node_clock_offset, pod_time


def pod(bound: str, taken: str) -> dict:
    condition = {"type": "PodScheduled", "status": "True", "lastTransitionTime": bound}
    return {"status": {"startTime": taken, "conditions": [condition]}}


#: up to 5 s either way (whole seconds), and a kubelet that took the pod seconds late: 6 s was
#: seen on a loaded test machine, where billing then started a session 6 s before its container
@pytest.mark.parametrize(
    "taken",
    [
        "2026-12-01T10:00:01Z",
        "2026-12-01T10:00:05Z",
        "2026-12-01T10:00:06Z",
        "2026-12-01T10:00:30Z",
    ],
)
def test_a_busy_kubelets_moment_is_not_taken_for_a_clock_offset(taken):
    busy = pod("2026-12-01T10:00:00Z", taken)
    assert node_clock_offset(busy) == timedelta(0)
    assert pod_time(busy, "2026-12-01T10:00:09Z").isoformat() == "2026-12-01T10:00:09+00:00"


@pytest.mark.parametrize("minutes", [7, -7])
def test_a_node_minutes_off_is_read_on_the_api_servers_clock(minutes):
    taken = f"2026-12-01T10:{30 + minutes:02d}:01Z"
    skewed = pod("2026-12-01T10:30:00Z", taken)
    assert node_clock_offset(skewed) == timedelta(minutes=minutes, seconds=1)
    started = pod_time(skewed, f"2026-12-01T10:{30 + minutes:02d}:04Z")
    assert started.isoformat() == "2026-12-01T10:30:03+00:00"


def test_a_node_behind_is_corrected_from_beyond_a_few_seconds():
    """The kubelet's moment only ever adds to the difference, so a node behind by more than
    whole seconds' rounding is behind: billing would otherwise start sessions early."""
    behind = pod("2026-12-01T10:00:10Z", "2026-12-01T10:00:04Z")
    assert node_clock_offset(behind) == timedelta(seconds=-6)
    assert pod_time(behind, "2026-12-01T10:00:05Z").isoformat() == "2026-12-01T10:00:11+00:00"
