"""Node clocks that differ from the API server's: the kubelet writes a container's start and
end by its node's clock, and billing must still meter what the user saw, to the second."""

import time
from datetime import UTC, datetime, timedelta

import pytest

#: how far a node's clock is off: far more than any start or stop takes
SKEW = timedelta(minutes=5)
#: the API's times have whole seconds, and a start or stop is seen within about one
SLACK = timedelta(seconds=2)


def hub_now() -> datetime:
    return datetime.now(UTC)


@pytest.mark.parametrize(
    "user,card,node,skew",
    [("ahead", "L40S", "gpu-l40s", SKEW), ("behind", "A100-80GB", "gpu-a100", -SKEW)],
)
def test_a_node_clock_ahead_or_behind_bills_what_the_user_saw(
    platform, cluster, user, card, node, skew
):
    platform.create_user(user)
    cluster.skew_clock(node, skew)
    try:
        asked = hub_now()
        r = platform.spawn(user, {"kind": "card", "card": card})
        assert r.status_code in (201, 202), r.text
        platform.wait_ready(user)
        ready = hub_now()
        time.sleep(3)
        stop_asked = hub_now()
        platform.stop_server(user)
        stopped = hub_now()
    finally:
        cluster.skew_clock(node, timedelta(0))
    [session] = platform.sessions(user)
    started = datetime.fromisoformat(session["started_at"])
    ended = datetime.fromisoformat(session["ended_at"])
    # never before the spawn was asked, never after the user had the server
    assert asked - SLACK <= started <= ready, (asked, started, ready)
    assert stop_asked - SLACK <= ended <= stopped, (stop_asked, ended, stopped)
    assert session["billed_seconds"] == int((ended - started).total_seconds())
    assert session["billed_seconds"] <= (stopped - asked).total_seconds() + 1
