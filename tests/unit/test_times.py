"""Node clock offsets (gputap_common/times.py): a node minutes off is corrected, a healthy one
whose kubelet took the pod a second or two after binding is not."""

from datetime import timedelta

import pytest

from gputap_common.times import node_clock_offset, pod_time


def pod(bound: str, taken: str) -> dict:
    condition = {"type": "PodScheduled", "status": "True", "lastTransitionTime": bound}
    return {"status": {"startTime": taken, "conditions": [condition]}}


@pytest.mark.parametrize("taken", ["2026-12-01T10:00:01Z", "2026-12-01T10:00:05Z"])
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
