"""Times as other systems write them, read as timezone-aware datetimes.

A kubelet writes a pod's times (``status.startTime``, a container's ``startedAt`` and
``finishedAt``) by its node's clock, which may be minutes off the API server's and the hub's
when the node's NTP is broken. :func:`pod_time` reads such a time on the API server's clock,
which is the one gputap bills by (docs/kubernetes.md, "Clocks").
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

#: node clock offsets up to this are taken as none (whole seconds, either way)
CLOCK_TOLERANCE = timedelta(seconds=5)
#: a node ahead by up to this is taken as on time: the kubelet's moment between binding and
#: taking the pod only ever adds to the measured offset, and a loaded kubelet's takes seconds
#: (6 s seen on a loaded test machine); taking it for an offset would start a session before
#: its container did. A node this little ahead is read as written: its times are late by as
#: much, in the user's favour for a start, and an end is never taken later than it was seen.
KUBELET_MOMENT = timedelta(seconds=30)


def parse_kube_time(value: str | None) -> datetime | None:
    """A Kubernetes RFC 3339 time ("2026-11-29T19:00:00Z") as an aware datetime."""
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def node_clock_offset(pod: Mapping[str, Any]) -> timedelta:
    """How far the clock of a pod's node is ahead of the API server's (behind: negative).

    The API server marks a pod scheduled when it binds it (condition ``PodScheduled``, by its
    own clock); the node's kubelet takes the pod moments later and writes ``status.startTime``
    by the node's clock. The difference is the node's offset plus that moment (well under a
    second on a healthy node, seconds on a busy one). Zero when the pod shows neither yet, when
    the node is behind by :data:`CLOCK_TOLERANCE` or less, and when it is ahead by
    :data:`KUBELET_MOMENT` or less."""
    status = pod.get("status") or {}
    taken = parse_kube_time(status.get("startTime"))
    bound = next(
        (
            parse_kube_time(c.get("lastTransitionTime"))
            for c in status.get("conditions") or []
            if c.get("type") == "PodScheduled" and c.get("status") == "True"
        ),
        None,
    )
    if taken is None or bound is None:
        return timedelta(0)
    offset = taken - bound
    # both written to the second, and the kubelet's moment grows on a busy node: an offset this
    # small cannot be told from them, and taking it would move a healthy node's times
    if -CLOCK_TOLERANCE <= offset <= KUBELET_MOMENT:
        return timedelta(0)
    return offset


def pod_time(pod: Mapping[str, Any], value: str | None) -> datetime | None:
    """A time the pod's kubelet wrote (a container's ``startedAt``, ``finishedAt``), on the
    API server's clock."""
    when = parse_kube_time(value)
    return None if when is None else when - node_clock_offset(pod)
