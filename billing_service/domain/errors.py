"""Domain errors of billing; the web layer turns them into 404, 400 and 429."""

from __future__ import annotations


class UnknownSku(ValueError):
    """A SKU without a price."""


class NotFound(LookupError):
    """An account, session or hold that does not exist; the message says which."""


class Conflict(Exception):
    """An idempotency key reused for another request (409); the message says what to send."""


class JoinRateLimited(Exception):
    """Too many wrong join codes; the message says when to try again."""
