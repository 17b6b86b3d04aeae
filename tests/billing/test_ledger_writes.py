"""The one ledger writer (``store/ledger_writes.py``): every transaction of a batch is checked
before any of it is written, and balances move by exactly their postings, on SQLite and
PostgreSQL."""

from datetime import timedelta

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from billing_service.orm import Account, BillingSession, LedgerAccount
from billing_service.store.ledger_writes import Entry, write

from .conftest import T0


@pytest.fixture(autouse=True)
def books_balance(store):
    """The ledger check holds after every test here."""
    yield
    assert [str(p) for p in store.check_ledger()] == []


def ids(store, *codes: str) -> list[int]:
    with Session(store.engine) as db:
        found = dict(db.execute(select(LedgerAccount.code, LedgerAccount.id)).all())
    return [found[code] for code in codes]


def entry(key: str, *postings: tuple[int, int], account_id: int | None = None) -> Entry:
    return Entry(key, {"kind": "adjustment", "account_id": account_id}, tuple(postings))


def balances(store) -> dict[str, int]:
    with Session(store.engine) as db:
        return dict(db.execute(select(LedgerAccount.code, LedgerAccount.balance_micro)).all())


@pytest.mark.parametrize(
    ("postings", "why"),
    [
        (((0, 5), (1, -4)), "sum to 1"),
        (((0, 5), (1, -5), (0, 0)), "zero posting"),
        ((), "no postings"),
    ],
)
def test_a_bad_transaction_refuses_the_whole_batch_before_anything_is_written(store, postings, why):
    store.open_account("ada", T0)
    trial, counter = ids(store, "user:ada:trial", "system:trial-grants")
    accounts = (trial, counter)
    before = balances(store)
    good = entry("grant:good", (trial, 7), (counter, -7))
    bad = entry("grant:bad", *((accounts[i], amount) for i, amount in postings))
    with Session(store.engine) as db:
        with pytest.raises(AssertionError, match=f"grant:bad.*{why}"):
            write(db, [good, bad], T0)
        db.commit()  # had the writer written the good one first, it would stay
    assert [t.idempotency_key for t in store.transactions("ada")] == ["trial:ada"]
    assert balances(store) == before


def test_a_batch_is_written_in_order_and_balances_move_by_the_sum_of_postings(store):
    store.open_account("ada", T0)
    store.start_session("s1", "ada", "", "T4", 1, T0, T0)
    trial, paid, counter, revenue = ids(
        store, "user:ada:trial", "user:ada:paid", "system:trial-grants", "system:revenue:0"
    )
    with Session(store.engine) as db:
        account_id = db.scalar(select(Account.id).where(Account.username == "ada"))
    before = balances(store)
    charge = {"kind": "charge", "account_id": account_id, "session_id": "s1", "memo": "T4"}
    batch = [
        Entry("charge:s1:2", charge, ((trial, -300), (paid, -200), (revenue, 500))),
        entry("grant:k1", (counter, -50), (trial, 50), account_id=account_id),
    ]
    with Session(store.engine) as db:
        written = write(db, batch, T0 + timedelta(seconds=5), charged={"s1": 500})
        db.commit()
    txs = store.transactions("ada")[1:]
    assert [t.id for t in txs] == written  # the ids, in the batch's order
    assert [(t.idempotency_key, t.session_id, t.postings) for t in txs] == [
        (
            "charge:s1:2",
            "s1",
            (("user:ada:trial", -300), ("user:ada:paid", -200), ("system:revenue:0", 500)),
        ),
        ("grant:k1", None, (("system:trial-grants", -50), ("user:ada:trial", 50))),
    ]
    assert {t.created_at for t in txs} == {T0 + timedelta(seconds=5)}
    after = balances(store)
    moved = {code: after[code] - before[code] for code in after}
    assert {code: m for code, m in moved.items() if m} == {
        "user:ada:trial": -250,
        "user:ada:paid": -200,
        "system:trial-grants": -50,
        "system:revenue:0": 500,
    }
    with Session(store.engine) as db:
        assert db.get(BillingSession, "s1").charged_micro == 500
