"""Kubernetes list and watch as raw JSON, on kubernetes_asyncio's API clients: what the hub's
cluster inventory (spawner/kube/watch.py) and billing's pod meter both stand on.

Objects stay the API's JSON (dicts), not client models: watchers read a few fields of many
objects, and the JSON is what the API server sent.
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


async def list_objects(method: Callable[..., Awaitable[Any]], *args: Any, **kwargs: Any) -> Any:
    """One list call (``api.list_node``, ``api.list_namespaced_pod`` with its namespace...) as
    the JSON the API answered: ``{"items": [...], "metadata": {"resourceVersion": ...}}``."""
    response = await method(*args, _preload_content=False, **kwargs)
    return json.loads(await response.read())


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
    too old, so the caller lists again."""
    # a bare partial: the Watch finds no return type on it and hands over the JSON as is
    stream = watch.Watch().stream(
        partial(method, _preload_content=False),
        *args,
        resource_version=resource_version,
        timeout_seconds=timeout_seconds,
        **kwargs,
    )
    async with stream as events:
        async for event in events:
            obj = event["raw_object"]
            if event["type"] == "ERROR":
                raise ApiException(status=obj.get("code"), reason=obj.get("message"))
            if event["type"] in OBJECT_EVENTS:
                yield event["type"], obj
