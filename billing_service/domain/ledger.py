"""Double entry, pure: ledger account codes, funding kinds, the funding order, charge splits.

Every movement of credit is a transaction whose postings sum to zero. A user's credit lives in
pools (ledger accounts owned by the user); the other side of every grant and charge is a system
counter-account:

| kind | credits pool | debits |
|---|---|---|
| ``trial`` (first login) | ``user:U:trial`` | ``system:trial-grants`` |
| ``topup`` (paid, by an admin) | ``user:U:paid`` | ``system:topups`` |
| ``refund`` | ``user:U:paid`` | ``system:refunds`` |
| ``adjustment`` (signed) | ``user:U:paid`` | ``system:adjustments`` |
| ``allowance`` (a course's hours) | ``user:U:allowance:COURSE`` | ``system:allowance-grants`` |
| ``charge`` (a session) | ``system:revenue:K`` | the pools, in the funding order |

**Revenue shards.** Revenue is ``REVENUE_SHARDS`` counter-accounts, ``system:revenue:0`` to
``system:revenue:7``, and is their sum. A batch of interval charges credits the shard of its
worker, a stop the shard of its session: concurrent charge transactions then update different
rows instead of queueing on one (the row lock of a ledger account is held until commit).

**Funding order.** A session is paid from its course allowance first (course-funded sessions
only), then trial credit, then paid credit; a course session whose student did not opt in to
paying on when course hours run out is paid by the allowance alone. Each pool gives what it
has, never going below zero, except the last one, which takes the rest: the bounded overrun of
enforcement shows as a negative balance of that pool (paid: a debt the next top-up settles;
an allowance: the course's, written off when the week ends).
"""

from __future__ import annotations

import zlib
from collections import defaultdict
from collections.abc import Iterable, Sequence

FUNDING_KINDS = ("trial", "topup", "refund", "adjustment", "allowance")
CHARGE = "charge"
#: how many accounts revenue is spread over; changing it needs a migration (the shards exist
#: from the migration that made them, and revenue is read as the sum of REVENUE_CODES)
REVENUE_SHARDS = 8
REVENUE_CODES = tuple(f"system:revenue:{k}" for k in range(REVENUE_SHARDS))

_POOL = {
    "trial": "trial",
    "topup": "paid",
    "refund": "paid",
    "adjustment": "paid",
    "allowance": "allowance",
}
_COUNTER = {
    "trial": "system:trial-grants",
    "topup": "system:topups",
    "refund": "system:refunds",
    "adjustment": "system:adjustments",
    "allowance": "system:allowance-grants",
}


def _part(name: str) -> str:
    """A name as one part of a code: ``%`` and ``:`` escaped, so no name can reach into
    another's pools (``a:allowance`` is not user ``a``'s allowance)."""
    return name.replace("%", "%25").replace(":", "%3A")


def pool_code(username: str, pool: str, course: str = "") -> str:
    """The code of ``username``'s ``pool`` (``trial``, ``paid``, or ``allowance`` of ``course``)."""
    if pool == "allowance":
        return f"user:{_part(username)}:allowance:{_part(course)}"
    return f"user:{_part(username)}:{pool}"


def course_of_pool(code: str) -> str:
    """The course of an allowance pool's code (``user:a:allowance:intro`` -> ``intro``)."""
    part = code.rsplit(":allowance:", 1)[1]
    return part.replace("%3A", ":").replace("%25", "%")


def pool_name(code: str) -> tuple[str, str]:
    """(pool, course) of a user's pool code: ("trial", ""), ("paid", ""), ("allowance", C)."""
    if ":allowance:" in code:
        return "allowance", course_of_pool(code)
    return code.rsplit(":", 1)[1], ""


def funding_pool(kind: str) -> str:
    """The pool a funding ``kind`` credits."""
    return _POOL[kind]


def counter_account(kind: str) -> str:
    """The system account on the other side of a funding ``kind``."""
    return _COUNTER[kind]


def revenue_shard(key: str) -> int:
    """The revenue shard of ``key`` (a session id): stable, and spread evenly."""
    return zlib.crc32(key.encode()) % REVENUE_SHARDS


def funding_order(course: str = "", fallback: bool = True) -> list[tuple[str, str]]:
    """(pool, course) pairs in the order they pay for a session.

    A course session without ``fallback`` (the student did not opt in to paying on) is paid
    by its allowance alone, which then takes enforcement's overrun."""
    if course and not fallback:
        return [("allowance", course)]
    first = [("allowance", course)] if course else []
    return [*first, ("trial", ""), ("paid", "")]


def split_charge(amount: int, balances: Sequence[int]) -> list[int]:
    """How much of ``amount`` each pool pays, pools in funding order.

    Each pool pays up to its balance (a pool at or below zero pays nothing); the last pool
    pays whatever is left, even past zero. The parts always sum to ``amount``.
    """
    if not balances:
        raise ValueError("a charge needs at least one pool")
    parts: list[int] = []
    left = amount
    for balance in balances[:-1]:
        part = min(left, max(balance, 0))
        parts.append(part)
        left -= part
    parts.append(left)
    return parts


def split_refund(amount: int, taken: Sequence[int]) -> list[int]:
    """How much of ``amount`` (positive) goes back to each pool, pools in funding order.

    A refund undoes the latest takings first: the last pool gets back up to what it paid, then
    the one before; anything beyond what was taken goes to the last pool.
    """
    parts = [0] * len(taken)
    left = amount
    for i in reversed(range(len(taken))):
        part = min(left, max(taken[i], 0))
        parts[i] = part
        left -= part
    parts[-1] += left
    return parts


class UnbalancedTransaction(AssertionError):
    """A transaction the ledger refuses to write: a bug in the code that built it, never a
    user's request (so not a ``ValueError``, which the handlers answer with a 400)."""


def check_transaction(key: str, postings: Sequence[tuple[int, int]]) -> None:
    """``UnbalancedTransaction`` unless ``postings`` ((ledger account, signed amount) pairs)
    form a transaction the ledger takes: at least one posting, none of zero, summing to zero.
    The one check of every transaction, as TigerBeetle validates every transfer of a batch."""
    if not postings:
        raise UnbalancedTransaction(f"transaction {key}: no postings")
    if any(amount == 0 for _, amount in postings):
        raise UnbalancedTransaction(f"transaction {key}: a zero posting in {list(postings)}")
    total = sum(amount for _, amount in postings)
    if total != 0:
        raise UnbalancedTransaction(
            f"unbalanced transaction {key}: postings {list(postings)} sum to {total}"
        )


def balance_moves(postings: Iterable[tuple[int, int]]) -> dict[int, int]:
    """How much each ledger account's balance moves: the sum of its postings, by account id
    in ascending order (the order rows are locked in); accounts whose postings cancel out are
    left out."""
    moved: defaultdict[int, int] = defaultdict(int)
    for account, amount in postings:
        moved[account] += amount
    return {account: moved[account] for account in sorted(moved) if moved[account]}


def check_funding(kind: str, amount_micro: int, course: str = "") -> None:
    """``ValueError`` naming what is wrong with a grant: ``kind`` is one of FUNDING_KINDS, only
    adjustments may be negative, and allowances, and only they, name a course."""
    if kind not in FUNDING_KINDS:
        raise ValueError(f"kind must be one of {', '.join(FUNDING_KINDS)}, not {kind!r}")
    if amount_micro == 0 or (amount_micro < 0 and kind != "adjustment"):
        raise ValueError(
            f"amount: a {kind} must be positive"
            + (" (a negative adjustment takes credit away)" if kind == "adjustment" else "")
        )
    if (kind == "allowance") != bool(course):
        raise ValueError(
            "course: an allowance names its course"
            if kind == "allowance"
            else f"course: only an allowance names a course, not a {kind}"
        )
