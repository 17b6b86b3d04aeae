"""Domain errors of the billing store; the web layer turns them into 404 and 400."""

from __future__ import annotations


class UnknownSku(ValueError):
    """A SKU without a price."""


class NotFound(LookupError):
    """An account, session or hold that does not exist; the message says which."""
