"""Kubernetes list and watch as raw JSON, on kubernetes_asyncio's API clients: what the hub's
cluster inventory (spawner/kube/watch.py) and billing's pod meter both stand on.

Objects stay the API's JSON (dicts), not client models: watchers read a few fields of many
objects, and the JSON is what the API server sent.

Every request has a client-side timeout. A connection that a NAT or load balancer forgot
sends nothing and closes nothing: without a timeout a list or a watch on it waits forever and
the cache it feeds goes stale without a word (KubeSpawner's reflectors time their watches
out the same way: ``request_timeout`` over ``timeout_seconds``).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial
from typing import Any

from kubernetes_asyncio import watch
from kubernetes_asyncio.client import ApiException

#: the event types that carry an object
OBJECT_EVENTS = ("ADDED", "MODIFIED", "DELETED")
#: how long a list may take before it is given up (it answers in well under a second when the
#: connection is alive, even for thousands of pods)
LIST_TIMEOUT_SECONDS = 30
#: how long past its ``timeoutSeconds`` a watch may stay open: the API server ends a watch
#: on time, so one still open after that is a dead connection
WATCH_GRACE_SECONDS = 5


class SilentWatch(TimeoutError):
    """A watch stayed open past its end with nothing sent: its connection is dead."""


async def list_objects(method: Callable[..., Awaitable[Any]], *args: Any, **kwargs: Any) -> Any:
    """One list call (``api.list_node``, ``api.list_namespaced_pod`` with its namespace...) as
    the JSON the API answered: ``{"items": [...], "metadata": {"resourceVersion": ...}}``.
    ``ApiException`` with the API's status and message when it refused the list (the raw
    answer the client hands over is then a Status, which must never pass for an empty list);
    ``TimeoutError`` when no answer came within LIST_TIMEOUT_SECONDS."""
    response = await method(
        *args, _preload_content=False, _request_timeout=LIST_TIMEOUT_SECONDS, **kwargs
    )
    body = await response.read()
    if not 200 <= response.status <= 299:
        raise ApiException(status=response.status, reason=_refusal(body, response.reason))
    return json.loads(body)


def _refusal(body: bytes, reason: str | None) -> str:
    """What a Status answer says was wrong (its message), else the HTTP reason."""
    try:
        message = json.loads(body).get("message")
    except (ValueError, AttributeError):
        message = None
    return str(message or reason or "no reason given")[:300]


async def watch_objects(
    method: Callable[..., Awaitable[Any]],
    *args: Any,
    resource_version: str,
    timeout_seconds: int,
    **kwargs: Any,
) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    """``(event type, object)`` for each ADDED, MODIFIED and DELETED event after
    ``resource_version``, until the server ends the watch (after ``timeout_seconds``).

    An ERROR event raises :class:`ApiException` with its code: 410 Gone when that version is
    too old, so the caller lists again. :class:`SilentWatch` when the watch is still open
    WATCH_GRACE_SECONDS after it should have ended: its connection is dead, and the caller
    lists again (what the connection withheld is not known)."""
    # a bare partial: the Watch finds no return type on it and hands over the JSON as is;
    # a number as _request_timeout bounds the whole request, the stream included
    stream = watch.Watch().stream(
        partial(
            method,
            _preload_content=False,
            _request_timeout=timeout_seconds + WATCH_GRACE_SECONDS,
        ),
        *args,
        resource_version=resource_version,
        timeout_seconds=timeout_seconds,
        **kwargs,
    )
    try:
        async with stream as events:
            async for event in events:
                obj = event["raw_object"]
                if event["type"] == "ERROR":
                    raise ApiException(status=obj.get("code"), reason=obj.get("message"))
                if event["type"] in OBJECT_EVENTS:
                    yield event["type"], obj
    except TimeoutError:
        raise SilentWatch(
            f"the watch sent nothing for {WATCH_GRACE_SECONDS} s past its end "
            f"({timeout_seconds} s): its connection is dead"
        ) from None
