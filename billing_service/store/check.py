"""The ledger check on the database: everything that would make the books wrong."""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from ..domain import ledger
from ..domain.records import LedgerProblem
from ..orm import BillingSession, LedgerAccount, LedgerTransaction, Posting
from . import postings
from .operations import reads


@reads
def check_ledger(db: Session) -> list[LedgerProblem]:
    """Everything that would make the books wrong; an empty list means they balance.

    Every transaction has postings summing to zero; every ledger account's balance is the
    sum of its postings; all balances sum to zero; revenue, the sum of its shards, is what
    charges took from users' pools; every session's ``charged_micro`` is what its charge
    transactions took from its owner's pools, and an ended session was charged exactly its
    cost."""
    problems: list[LedgerProblem] = []
    sums = (
        select(
            LedgerTransaction.idempotency_key,
            func.coalesce(func.sum(Posting.amount_micro), 0),
            func.count(Posting.id),
        )
        .outerjoin(Posting, Posting.transaction_id == LedgerTransaction.id)
        .group_by(LedgerTransaction.id, LedgerTransaction.idempotency_key)
    )
    for key, total, n in db.execute(sums):
        if total != 0 or n < 2:
            problems.append(
                LedgerProblem("unbalanced transaction", f"{key}: sum {total}, {n} postings")
            )
    balances = (
        select(
            LedgerAccount.code,
            LedgerAccount.balance_micro,
            func.coalesce(func.sum(Posting.amount_micro), 0),
        )
        .outerjoin(Posting, Posting.ledger_account_id == LedgerAccount.id)
        .group_by(LedgerAccount.id, LedgerAccount.code, LedgerAccount.balance_micro)
    )
    grand = 0
    for code, balance, total in db.execute(balances):
        grand += balance
        if balance != total:
            problems.append(LedgerProblem("balance differs", f"{code}: {balance} != sum {total}"))
    if grand != 0:
        problems.append(LedgerProblem("books do not sum to zero", str(grand)))
    revenue = postings.revenue_micro(db)
    charged = dict(
        db.execute(
            select(LedgerTransaction.session_id, -func.sum(Posting.amount_micro))
            .join(Posting, Posting.transaction_id == LedgerTransaction.id)
            .join(LedgerAccount, LedgerAccount.id == Posting.ledger_account_id)
            .where(
                LedgerTransaction.kind == ledger.CHARGE,
                LedgerAccount.account_id.is_not(None),
            )
            .group_by(LedgerTransaction.session_id)
        ).all()
    )
    # revenue (the sum of its shards) is exactly what charges took from the users
    taken = sum(int(v or 0) for v in charged.values())
    if revenue != taken:
        problems.append(LedgerProblem("revenue differs from charges", f"{revenue} != {taken}"))
    for row in db.execute(
        select(
            BillingSession.id,
            BillingSession.charged_micro,
            BillingSession.cost_micro,
            BillingSession.ended_at,
        )
    ):
        posted = int(charged.get(row.id) or 0)
        if posted != row.charged_micro:
            problems.append(
                LedgerProblem(
                    "session charges differ",
                    f"{row.id}: charged_micro {row.charged_micro}, postings {posted}",
                )
            )
        if row.ended_at is not None and row.charged_micro != row.cost_micro:
            problems.append(
                LedgerProblem(
                    "ended session not settled",
                    f"{row.id}: cost {row.cost_micro}, charged {row.charged_micro}",
                )
            )
    return problems
