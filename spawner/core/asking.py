"""What the spawn form knows of the user beyond the options: their own credit (course hours
are not credit) and the start of theirs that was just refused. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gputap_common.money import format_credits

from .placement import MIG_PROFILE_KEY, Alternative


def format_duration(seconds: int | None) -> str:
    """Seconds as "2 h 05 min", "45 min" or "under 1 min"."""
    if seconds is None:
        return "unlimited"
    if seconds < 60:
        return "under 1 min"
    hours, minutes = divmod(seconds // 60, 60)
    return f"{hours} h {minutes:02d} min" if hours else f"{minutes} min"


@dataclass(frozen=True)
class Credit:
    """The user's own credit (trial + paid; course hours are not credit), from billing's
    account view ``credit``: what it is, what is available now, and what a new server may
    claim (``free``: available less what starting servers hold)."""

    trial_micro: int
    paid_micro: int
    available_micro: int
    free_micro: int
    currency: str = "credits"
    #: what admission asks a new server to be able to pay: this many seconds at its price
    min_billable_seconds: int = 0

    def needs(self, price_per_hour_micro: int) -> int:
        """What admission asks credit to cover for a server at this price per hour."""
        return price_per_hour_micro * max(self.min_billable_seconds, 1) // 3600

    def covers(self, price_per_hour_micro: int) -> bool:
        return self.free_micro >= self.needs(price_per_hour_micro)

    def shortfall(self, price_per_hour_micro: int) -> str:
        """Why the credit cannot start a server at this price, as the form says it."""
        seconds = max(self.min_billable_seconds, 1)
        first = f"{seconds} s" if seconds < 60 else format_duration(seconds)
        return (
            f"needs {format_credits(self.needs(price_per_hour_micro))} {self.currency} for "
            f"the first {first} (the least a server is billed); you have "
            f"{format_credits(max(self.free_micro, 0))}"
        )


def credit_of(account: Mapping[str, object], min_billable_seconds: int = 0) -> Credit:
    """Billing's account view (with its ``credit`` part) as the form's Credit."""
    credit = account.get("credit") or {}
    available = credit.get("available_micro", account.get("available_micro", 0))
    return Credit(
        trial_micro=credit.get("trial_micro", 0),
        paid_micro=credit.get("paid_micro", 0),
        available_micro=available,
        free_micro=credit.get("free_micro", available),
        currency=str(account.get("currency") or "credits"),
        min_billable_seconds=min_billable_seconds,
    )


def picked_value(options: Mapping[str, object] | None) -> str | None:
    """The form's ``choice`` value that posted ``options`` (the radio to select again after
    a refusal), or None."""
    if not options:
        return None
    kind, card = options.get("kind"), options.get("card")
    if kind == "card":
        value = f"card:{card}"
    elif kind == "slice":
        value = f"slice:{card}/{options.get(MIG_PROFILE_KEY)}"
    elif kind == "shared":
        value = f"shared:{card}/shared"
    elif kind in ("spec", "cpu"):
        value = "spec" if kind == "spec" else "cpu:cpu"
    else:
        return None
    course = options.get("course")
    return f"course:{course}:{value}" if course else value


@dataclass(frozen=True)
class Refused:
    """A start refused from the form: the sentence to show, what was asked (to select it
    again, with what was typed) and the options to offer instead."""

    message: str
    options: Mapping[str, object]
    alternatives: tuple[Alternative, ...] = ()
    #: the fields the form posted (first values), to show what was typed again
    typed: Mapping[str, str] = field(default_factory=dict)
