"""Moving a billing account to another username (a renamed GitHub login, docs/github.md
"Renamed logins: moving an account"): everything keyed by the username follows, the money
exactly; the new name's untouched trial account is discarded, anything more refuses."""

from dataclasses import replace
from datetime import timedelta

import pytest

from billing_service.domain.courses import course_rules
from billing_service.domain.errors import Conflict, NotFound

from .conftest import T0

SKUS = {"RTX-4090", "T4", "A100-80GB", "A100-80GB/1g.10gb", "cpu"}
TRIAL = 10_000_000


@pytest.fixture(autouse=True)
def books_balance(store):
    """The ledger check holds after every move, refused or not."""
    yield
    assert [str(p) for p in store.check_ledger()] == []


def course(store, slug="dl101", instructor="prof"):
    rules = course_rules({"name": slug, "weekly_hours": 2, "allowed": ["T4"]}, SKUS)
    return store.create_course(instructor, rules, slug, T0, join_code=False)


def history(store, username):
    """What a move must keep: balance, pools by kind, ledger, sessions (the name aside)."""
    state = store.account(username, T0 + timedelta(hours=3))
    pools = {code.split(":", 2)[2]: balance for code, balance in state.pools.items()}
    transactions = [
        (t.id, t.kind, t.amount_micro, t.memo, t.session_id, t.created_at)
        for t in store.transactions(username)
    ]
    sessions = [replace(s, username="") for s in store.sessions(username)]
    return state.balance_micro, pools, transactions, sessions


def test_a_move_keeps_money_ledger_sessions_and_courses_exactly(store):
    store.open_account("jo", T0)
    store.grant("jo", "topup", 25_000_000, "card", "t1", T0)
    course(store, "dl101")
    store.enroll("dl101", "jo", "team", T0)
    store.set_fallback("dl101", "jo", True)
    store.start_session("s1", "jo", "", "T4", 1, T0, T0, course="dl101")
    store.stop_session("s1", T0 + timedelta(minutes=20), T0)
    store.start_session("s2", "jo", "", "RTX-4090", 1, T0, T0)
    store.stop_session("s2", T0 + timedelta(hours=1), T0)
    # a data disk's storage session stays open: a disk is no server
    store.start_session("d1", "jo", "disk:data", "disk", 50, T0, T0, "storage")
    course(store, "ml201", instructor="jo")
    store.make_instructor("jo", "admin", T0)
    store.open_account("jo-new", T0 + timedelta(hours=2))  # the new login's first sign-in
    before = history(store, "jo")

    moved = store.move_account("jo", "jo-new", T0 + timedelta(hours=2))

    assert moved.state.username == "jo-new"
    assert moved.discarded_trial_micro == TRIAL
    with pytest.raises(NotFound):
        store.account("jo", T0)
    assert history(store, "jo-new") == before
    assert {code for code in store.account("jo-new", T0).pools} == {
        "user:jo-new:trial",
        "user:jo-new:paid",
        "user:jo-new:allowance:dl101",
    }
    assert [s.username for s in store.sessions("jo-new")] == ["jo-new"] * 3
    assert ("jo-new", "team", True) in store.students("dl101")
    assert store.teaches("jo-new", "ml201") and store.is_instructor("jo-new")
    assert not store.teaches("jo", "ml201") and not store.is_instructor("jo")
    # no free money: only jo's own trial credit was ever granted, and this week's course
    # hours are not granted again under the new name
    grants = store.transactions("jo-new")
    assert [t.idempotency_key for t in grants if t.kind == "trial"] == ["trial:jo-new"]
    store.student_courses("jo-new", T0 + timedelta(hours=3))
    assert history(store, "jo-new") == before

    # the old login is free: whoever takes it next starts with a trial account of their own
    state, created = store.open_account("jo", T0 + timedelta(days=1))
    assert created and state.balance_micro == TRIAL
    assert not store.teaches("jo", "ml201")


def test_a_move_to_a_name_without_an_account_renames_it(store):
    store.open_account("jo", T0)
    store.grant("jo", "topup", 5_000_000, "card", "t1", T0)
    moved = store.move_account("jo", "jo2", T0)
    assert moved.discarded_trial_micro is None
    assert store.account("jo2", T0).balance_micro == TRIAL + 5_000_000


def test_refused_while_a_server_runs_or_starts(store):
    store.open_account("jo", T0)
    store.start_session("s1", "jo", "", "T4", 1, T0, T0)
    with pytest.raises(Conflict, match="jo has a server running \\(T4\\): stop it first"):
        store.move_account("jo", "jo-new", T0)
    store.stop_session("s1", T0 + timedelta(minutes=5), T0)
    store.admit("jo", "T4", 1, T0 + timedelta(minutes=6))
    with pytest.raises(Conflict, match="jo has a server starting"):
        store.move_account("jo", "jo-new", T0 + timedelta(minutes=6))
    assert store.account("jo", T0).username == "jo"


@pytest.mark.parametrize(
    "given, said",
    [
        (lambda s: s.grant("jo-new", "topup", 5_000_000, "card", "k", T0), "paid credit 5.00"),
        (lambda s: s.enroll("dl101", "jo-new", "code", T0), "a student of dl101"),
        (lambda s: course(s, "ml201", instructor="jo-new"), "the instructor of ml201"),
        (lambda s: s.make_instructor("jo-new", "admin", T0), "an instructor"),
        (
            lambda s: s.start_session("x", "jo-new", "disk:d", "disk", 5, T0, T0, "storage"),
            "1 session (servers or disks)",
        ),
    ],
)
def test_refused_when_the_new_name_holds_anything_but_its_trial(store, given, said):
    store.open_account("jo", T0)
    store.open_account("jo-new", T0)
    course(store, "dl101")
    given(store)
    before = history(store, "jo"), history(store, "jo-new")
    with pytest.raises(Conflict) as refused:
        store.move_account("jo", "jo-new", T0)
    assert said in str(refused.value)
    assert "jo-new already holds" in str(refused.value)
    assert (history(store, "jo"), history(store, "jo-new")) == before


def test_unknown_account_and_same_name(store):
    with pytest.raises(NotFound, match="nobody"):
        store.move_account("nobody", "jo", T0)
    store.open_account("jo", T0)
    with pytest.raises(ValueError, match="to: the account is already named 'jo'"):
        store.move_account("jo", "jo", T0)
