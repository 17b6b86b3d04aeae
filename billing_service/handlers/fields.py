"""What callers send: the fields of request bodies and query arguments, checked and bounded.

Each helper answers the value or raises ``HTTPError(400)`` naming the field and what it must
be. The bounds keep every accepted value storable: text fits its column, counts and times
keep every cost inside the 64-bit money columns (``money.MAX_COUNT``, ``EARLIEST_TIME``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from tornado import web

from gputap_common.bodies import BodyRefused, json_object, shown
from gputap_common.names import WORKER_RULE, is_worker_name

from ..domain.money import EARLIEST_TIME, LATEST_TIME, MAX_COUNT
from ..domain.pricing import ON_DEMAND, PRICE_CLASSES

#: the longest text each field may hold: the columns are VARCHAR(255), and ledger codes and
#: idempotency keys join several fields ("user:{username}:allowance:{course}", "grant:{key}",
#: "charge:{session id}:final")
MAX_LENGTH = {
    "username": 100,
    "course": 100,
    "sku": 100,
    "id": 200,
    "idempotency_key": 200,
    "hold_id": 64,
    "environment": 300,
    "reason": 1000,
}
#: any other text field
DEFAULT_MAX_LENGTH = 255
#: path arguments: usernames, session and hold ids
MAX_PATH_LENGTH = MAX_LENGTH["id"]
#: the largest request body billing reads (413 above it): the biggest real one, a price
#: book of every card and slice, is a few KiB
MAX_BODY_BYTES = 64 * 1024
#: what tornado itself reads at most before answering 400 and closing the connection
MAX_STREAM_BYTES = 16 * 1024 * 1024


def read_body(raw: bytes, allowed: Iterable[str]) -> dict[str, Any]:
    """A request body: a JSON object whose keys are all in ``allowed``, numbers written in
    decimal notation; 400 naming what is wrong otherwise (its size was checked as the
    request came in: BaseHandler.prepare)."""
    try:
        return json_object(raw or b"null", allowed, decimals_only=True)  # none: not an object
    except BodyRefused as e:
        raise web.HTTPError(400, str(e)) from None


#: a SKU in a price book: a card or "cpu" (letters, digits, "." and "-"), or a card's slice
#: CARD/<g>g.<m>gb or CARD/shared; matched whole
SKU_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9.-]{0,63}(/([1-7]g\.[0-9]{1,4}gb|shared))?")


def check_text(value: str, what: str, limit: int) -> str:
    """Refuse text no column can hold: NUL characters (PostgreSQL refuses them) and more than
    ``limit`` characters."""
    if "\x00" in value:
        raise web.HTTPError(400, f"{what} must not contain NUL characters")
    if len(value) > limit:
        raise web.HTTPError(400, f"{what} must be at most {limit} characters, not {len(value)}")
    return value


def _field(body: dict[str, Any], key: str, kind: type, what: str) -> Any:
    if key not in body:
        raise web.HTTPError(400, f"Missing field {key!r}: {what}")
    value = body[key]
    if isinstance(value, bool) or not isinstance(value, kind):
        raise web.HTTPError(400, f"Field {key!r} must be {what}, not {shown(value)}")
    return value


def optional_text(body: dict[str, Any], key: str) -> str | None:
    """An optional string field: absent or null is None; anything else must be a string."""
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise web.HTTPError(400, f"Field {key!r} must be a string, not {shown(value)}")
    return check_text(value, f"Field {key!r}", MAX_LENGTH.get(key, DEFAULT_MAX_LENGTH))


def text_field(body: dict[str, Any], key: str, *, empty_ok: bool = False) -> str:
    value = _field(body, key, str, "a string")
    if not empty_ok and not value.strip():
        raise web.HTTPError(400, f"Field {key!r} must not be empty")
    return check_text(value, f"Field {key!r}", MAX_LENGTH.get(key, DEFAULT_MAX_LENGTH))


def worker_field(body: dict[str, Any]) -> str:
    """A scale-out worker's name (``w1`` to ``w999``), or "" (absent, null or "") for a
    server's own session; 400 naming the field and its form otherwise."""
    value = body.get("worker")
    if value is None or value == "":
        return ""
    if not is_worker_name(value):
        raise web.HTTPError(
            400, f"Field 'worker' must be a worker's name, {WORKER_RULE}, not {shown(value, 20)}"
        )
    return value


def count_field(body: dict[str, Any]) -> int:
    what = f"an integer from 1 to {MAX_COUNT}"
    value = _field(body, "count", int, what)
    if not 1 <= value <= MAX_COUNT:
        raise web.HTTPError(400, f"Field 'count' must be {what}, not {value}")
    return value


def parse_time(text: str, what: str) -> datetime:
    """An ISO 8601 time with a timezone, from EARLIEST_TIME to LATEST_TIME; 400 otherwise.

    Outside those years a session's cost could overflow the money columns, and times near
    the years 1 and 9999 cannot even be converted to UTC."""
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise web.HTTPError(
            400, f"{what} must be an ISO 8601 time like 2025-01-01T12:00:00Z, not {shown(text)}"
        ) from None
    if value.tzinfo is None:
        raise web.HTTPError(400, f"{what} needs a timezone, e.g. {text}Z")
    if not EARLIEST_TIME <= value < LATEST_TIME:
        raise web.HTTPError(
            400,
            f"{what} must be from {EARLIEST_TIME.isoformat()} to {LATEST_TIME.isoformat()}, "
            f"not {shown(text)}",
        )
    return value


def price_class_field(body: dict[str, Any]) -> str:
    """``on-demand`` (the default), ``spot``, or ``storage`` (data disks, sku ``disk``)."""
    value = body.get("price_class", ON_DEMAND)
    if value not in PRICE_CLASSES:
        raise web.HTTPError(
            400,
            f"Field 'price_class' must be 'on-demand', 'spot' or 'storage' (data disks), "
            f"not {shown(value)}",
        )
    return value


def time_field(body: dict[str, Any], key: str) -> datetime:
    return parse_time(_field(body, key, str, "an ISO 8601 time with timezone"), f"Field {key!r}")


def time_argument(handler: web.RequestHandler, name: str) -> datetime | None:
    text = handler.get_argument(name, None)
    return None if text is None else parse_time(text, name)


#: the fields :func:`spawn_fields` reads
SPAWN_FIELDS = ("username", "sku", "count", "price_class", "course")


def spawn_fields(body: dict[str, Any]) -> dict[str, Any]:
    """What an admission and a session start both name, by the store's parameter names: who
    (``username``), what (``sku``, ``count``, ``price_class``) and the course that pays
    (``course``, "" for none)."""
    return {
        "username": text_field(body, "username"),
        "sku": text_field(body, "sku"),
        "count": count_field(body),
        "price_class": price_class_field(body),
        "course": optional_text(body, "course") or "",
    }
