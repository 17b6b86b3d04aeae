"""Moving an account to another username (a renamed GitHub login), pure: what the new name's
own account may hold and still be replaced, the refusals, and the ledger keys that name a
user.

The renamed person signed in once with their new login, which opened an account with trial
credit. That account is discarded when it is untouched (its trial credit and nothing else):
its credit is never added to the moved one, so a rename earns no second trial. Anything
more (paid credit, sessions, courses) refuses the move, naming it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gputap_common.money import format_credits

from .records import AccountState

#: ledger idempotency keys that name the account's user, as they are written
#: (store/accounts.py: ``trial:{user}``; store/courses.py: ``allowance:{course}:{user}:{week}``
#: and ``allowance-expiry:{course}:{user}:{week}``)
TRIAL_KEY = "trial"
COURSE_KEYS = ("allowance", "allowance-expiry")


@dataclass(frozen=True)
class Holdings:
    """What an account holds beyond its trial credit."""

    paid_micro: int = 0
    other_transactions: int = 0
    sessions: int = 0
    active_holds: int = 0
    student_of: Sequence[str] = ()
    teaches: Sequence[str] = ()
    instructor: bool = False

    def described(self) -> list[str]:
        """Each thing held, as a refusal names it; empty for an untouched account."""
        said = []
        if self.paid_micro:
            said.append(f"paid credit {format_credits(self.paid_micro)}")
        if self.sessions:
            n = self.sessions
            said.append(f"{n} session{'s' if n != 1 else ''} (servers or disks)")
        if self.active_holds:
            said.append("a server starting")
        said += [f"a student of {slug}" for slug in self.student_of]
        said += [f"the instructor of {slug}" for slug in self.teaches]
        if self.instructor:
            said.append("an instructor")
        if self.other_transactions and not said:
            n = self.other_transactions
            said.append(f"{n} ledger transaction{'s' if n != 1 else ''} besides its trial credit")
        return said


@dataclass(frozen=True)
class Moved:
    """A moved account: its state under the new name, and the trial credit of the new
    name's own account that was discarded (None when the name had no account)."""

    state: AccountState
    discarded_trial_micro: int | None


def check_names(old: str, new: str) -> None:
    """``ValueError`` when there is nothing to move."""
    if old == new:
        raise ValueError(f"to: the account is already named {old!r}")


def busy_refusal(old: str, running: Sequence[str], starting: int) -> str | None:
    """Why ``old`` cannot move now (a server runs or starts), None when it can. Its data
    disks' storage sessions are not servers: they move with it."""
    if running:
        return f"{old} has a server running ({', '.join(running)}): stop it first, then move"
    if starting:
        return f"{old} has a server starting: wait until it runs and stop it, then move"
    return None


def holdings_refusal(old: str, new: str, holdings: Holdings) -> str | None:
    """Why ``new``'s own account cannot be replaced by ``old``'s, None when it can."""
    said = holdings.described()
    if not said:
        return None
    return (
        f"{new} already holds {', '.join(said)}: moving {old} there would lose it. Only an "
        f"account with nothing but its trial credit is replaced; settle what {new} holds "
        "first (refund or adjust its credit, end its sessions and disks, leave its courses)"
    )


def renamed_key(key: str, old: str, new: str) -> str | None:
    """``key`` with ``old`` replaced by ``new`` where the key names the user (see
    TRIAL_KEY, COURSE_KEYS); None for any other key (charges name sessions, grants name
    what the admin sent). Course slugs hold no ``:``, so the user's part starts after the
    second one."""
    if key == f"{TRIAL_KEY}:{old}":
        return f"{TRIAL_KEY}:{new}"
    parts = key.split(":", 2)
    if len(parts) == 3 and parts[0] in COURSE_KEYS and parts[2].startswith(f"{old}:"):
        return f"{parts[0]}:{parts[1]}:{new}:{parts[2][len(old) + 1 :]}"
    return None
