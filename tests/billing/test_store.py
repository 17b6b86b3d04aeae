from datetime import timedelta

import pytest

from billing_service.domain import ledger
from billing_service.domain.courses import course_rules
from billing_service.domain.errors import Conflict, NotFound, UnknownSku
from billing_service.domain.pricing import make_price_book

from .conftest import T0

SKUS = {"RTX-4090", "T4", "A100-80GB", "A100-80GB/1g.10gb", "cpu"}


@pytest.fixture(autouse=True)
def books_balance(store):
    """(g) the ledger check holds after every store test."""
    yield
    assert [str(p) for p in store.check_ledger()] == []


def test_trial_credit_is_granted_once(store):
    state, created = store.open_account("ada", T0)
    assert created and state.balance_micro == 10_000_000
    state, created = store.open_account("ada", T0 + timedelta(days=1))
    assert not created and state.balance_micro == 10_000_000
    [trial] = store.transactions("ada")
    assert (trial.kind, trial.idempotency_key, trial.amount_micro) == ("trial", "trial:ada", 10**7)
    assert trial.postings == (("user:ada:trial", 10**7), ("system:trial-grants", -(10**7)))


def test_missing_account_is_not_found(store):
    with pytest.raises(NotFound, match="bob"):
        store.account("bob", T0)


def test_admission_at_the_boundary(store):
    store.open_account("ada", T0)
    # 5 minutes of A100-80GB at 8.00/h = 0.666666 credits; leave exactly that
    needed = 8_000_000 * 300 // 3600
    store.adjust("ada", needed - 10_000_000, "test", "k1", T0)
    admission = store.admit("ada", "A100-80GB", 1, T0, hold=False)
    assert admission.allowed and admission.needed_micro == needed and admission.hold is None
    assert admission.seconds_left == 299  # 666_666 micro at 8.00/h: 299.99 s
    store.adjust("ada", -1, "one micro less", "k2", T0)
    admission = store.admit("ada", "A100-80GB", 1, T0)
    assert not admission.allowed and admission.hold is None
    assert admission.message == (
        "Not enough credit for A100-80GB: 5 minutes at 8.00/h needs 0.666666 credits, "
        "you have 0.666665 available. Stop a running server or ask an admin for credit."
    )


def test_holds_stop_parallel_admissions_and_are_released(store):
    store.open_account("ada", T0)
    # credit for one 5-minute RTX-4090 period (0.416666) and a bit
    store.adjust("ada", 500_000 - 10_000_000, "leave 0.50", "k1", T0)
    answers = [store.admit("ada", "RTX-4090", 1, T0) for _ in range(20)]
    assert [a.allowed for a in answers].count(True) == 1
    assert "0.416666 is held for servers starting" in answers[1].message
    hold = answers[0].hold
    assert hold.amount_micro == 416_666 and store.account("ada", T0).held_micro == 416_666
    # the start failed: the hold goes back, and the next admission passes
    released = store.release_hold(hold.id, T0 + timedelta(seconds=3))
    assert released.release_reason == "released"
    assert store.release_hold(hold.id, T0 + timedelta(seconds=9)) == released
    assert store.admit("ada", "RTX-4090", 1, T0 + timedelta(seconds=4)).allowed
    with pytest.raises(NotFound, match="hold"):
        store.release_hold("nope", T0)


def test_a_started_hold_keeps_the_minimum_period_and_holds_expire(store):
    store.open_account("ada", T0)
    store.adjust("ada", 500_000 - 10_000_000, "leave 0.50", "k1", T0)
    first = store.admit("ada", "RTX-4090", 1, T0)
    store.start_session("s1", "ada", "", "RTX-4090", 1, T0, T0, hold_id=first.hold.id)
    assert store.holds("ada", T0) == []
    # the running server still claims its first 5 minutes
    assert not store.admit("ada", "RTX-4090", 1, T0 + timedelta(seconds=60)).allowed
    store.stop_session("s1", T0 + timedelta(seconds=60), T0 + timedelta(seconds=60))
    # an unstarted hold lapses after hold_seconds (900)
    late = store.admit("ada", "RTX-4090", 1, T0 + timedelta(seconds=61))
    assert late.allowed
    assert not store.admit("ada", "RTX-4090", 1, T0 + timedelta(seconds=62)).allowed
    assert store.admit("ada", "RTX-4090", 1, T0 + timedelta(seconds=61 + 900)).allowed


def test_admission_counts_running_cost_and_opens_account(store):
    admission = store.admit("new", "cpu", 1, T0)
    assert admission.allowed
    store.release_hold(admission.hold.id, T0)
    assert store.account("new", T0).balance_micro == 10_000_000
    store.start_session("s1", "new", "", "H200-141GB", 1, T0, T0)
    # 15.00/h: after 39.5 minutes 9.875 are spent; 5 min of 2 slices needs 0.19
    later = T0 + timedelta(minutes=39, seconds=30)
    assert store.admit("new", "A100-80GB", 4, later).allowed is False
    message = store.admit("new", "A100-80GB/1g.10gb", 2, later).message
    assert message == (
        "Not enough credit for 2 x A100-80GB/1g.10gb: 5 minutes at 2.285714/h needs "
        "0.190476 credits, you have 0.125 available. "
        "Stop a running server or ask an admin for credit."
    )


def test_unknown_sku(store):
    with pytest.raises(UnknownSku, match="B200"):
        store.admit("ada", "B200", 1, T0)
    with pytest.raises(UnknownSku):
        store.start_session("s1", "ada", "", "B200", 1, T0, T0)
    assert store.sessions("ada") == []


def test_session_start_is_idempotent(store):
    first, created = store.start_session("s1", "ada", "gpu", "RTX-4090", 1, T0, T0)
    assert created and first.price_per_hour_micro == 5_000_000
    again, created = store.start_session("s1", "ada", "other", "T4", 3, T0, T0)
    assert not created and again == first
    assert len(store.sessions("ada")) == 1


def test_stop_is_idempotent_with_one_charge(store):
    store.start_session("s1", "ada", "gpu", "RTX-4090", 1, T0, T0)
    stopped = store.stop_session("s1", T0 + timedelta(seconds=7200, microseconds=900), T0)
    assert stopped.billed_seconds == 7200 and stopped.cost_micro == 10_000_000
    again = store.stop_session("s1", T0 + timedelta(hours=5), T0)
    assert again == stopped
    charges = [t for t in store.transactions("ada") if t.kind == "charge"]
    assert len(charges) == 1 and charges[0].amount_micro == -10_000_000
    assert charges[0].idempotency_key == "charge:s1:final"
    # revenue: the shard of the session
    shard = f"system:revenue:{ledger.revenue_shard('s1')}"
    assert charges[0].postings == (("user:ada:trial", -(10**7)), (shard, 10**7))
    assert store.account("ada", T0).balance_micro == 0
    assert store.revenue_micro() == 10**7 and isinstance(store.revenue_micro(), int)


def test_interval_charges_are_deterministic_and_the_stop_settles_the_rest(store):
    store.start_session("s1", "ada", "", "RTX-4090", 1, T0, T0)
    assert store.post_interval_charges(T0 + timedelta(seconds=29), 30) == 0
    at = T0 + timedelta(seconds=95)
    assert store.post_interval_charges(at, 30) == 1
    assert store.post_interval_charges(at, 30) == 0  # a replay changes nothing
    [charge] = [t for t in store.transactions("ada") if t.kind == "charge"]
    # 90 s of 5.00/h = 0.125, under the key of the third interval
    assert (charge.idempotency_key, charge.amount_micro) == ("charge:s1:3", -125_000)
    state = store.account("ada", at)
    assert state.balance_micro == 10_000_000 - 125_000
    assert state.available_at(at) == 10_000_000 - 131_944  # 95 s of 5.00/h, floored
    stopped = store.stop_session("s1", T0 + timedelta(seconds=100), at)
    assert stopped.cost_micro == stopped.charged_micro == 138_888
    final = store.transactions("ada")[-1]
    assert (final.idempotency_key, final.amount_micro) == ("charge:s1:final", -13_888)


def test_a_late_stop_gives_back_what_interval_charges_took_beyond_it(store):
    store.open_account("ada", T0)
    store.grant("ada", "topup", 1_000_000, "paid", "t1", T0)
    store.adjust("ada", -9_900_000, "most trial used", "k1", T0)  # trial 10.00, paid 0.10
    store.start_session("s1", "ada", "", "H200-141GB", 1, T0, T0)
    # 60 s of 15.00/h = 0.25: 0.10 from trial, 0.15 from paid... in funding order
    store.post_interval_charges(T0 + timedelta(seconds=60), 30)
    pools = store.account("ada", T0).pools
    assert pools == {"user:ada:trial": 9_750_000, "user:ada:paid": -8_900_000}
    # the stop arrives late and says the server stopped after 20 s: 0.083333
    stopped = store.stop_session("s1", T0 + timedelta(seconds=20), T0 + timedelta(seconds=70))
    assert stopped.charged_micro == stopped.cost_micro == 83_333
    assert store.account("ada", T0).balance_micro == 1_100_000 - 83_333
    assert store.transactions("ada")[-1].amount_micro == 250_000 - 83_333


def test_funding_order_course_allowance_then_trial_then_paid(store):
    # 72 s of an RTX-4090 a week: 0.10 of allowance
    rules = course_rules({"name": "DL 101", "weekly_hours": 0.02, "allowed": ["RTX-4090"]}, SKUS)
    store.create_course("prof", rules, "dl101", T0, join_code=False)
    store.enroll("dl101", "stu", "instructor", T0)
    store.set_fallback("dl101", "stu", True)
    store.grant("stu", "topup", 5_000_000, "card", "t1", T0)
    store.adjust("stu", -9_950_000, "paid pool in debt", "k1", T0)
    store.start_session("c1", "stu", "", "RTX-4090", 1, T0, T0, course="dl101")
    store.stop_session("c1", T0 + timedelta(seconds=360), T0)  # 0.50
    pools = store.account("stu", T0).pools
    assert pools["user:stu:allowance:dl101"] == 0
    assert pools["user:stu:trial"] == 10_000_000 - 400_000
    with pytest.raises(ValueError, match="course"):
        store.grant("stu", "allowance", 1, "no course", "a2", T0)
    with pytest.raises(ValueError, match="positive"):
        store.grant("stu", "topup", -5, "negative", "t2", T0)


def test_grants_replay_and_balance_is_sum_of_postings(store):
    store.start_session("s1", "ada", "", "A100-40GB", 1, T0, T0)
    store.stop_session("s1", T0 + timedelta(seconds=5400), T0)
    first, created = store.adjust("ada", 2_500_000, "course grant", "grant-1", T0)
    again, created_again = store.adjust("ada", 2_500_000, "course grant", "grant-1", T0)
    assert created and not created_again and again == first
    # the same key with another body is not a replay (docs/security.md)
    with pytest.raises(Conflict, match="different body"):
        store.adjust("ada", 2_500_000, "double click", "grant-1", T0)
    txs = store.transactions("ada")
    assert [t.kind for t in txs] == ["trial", "charge", "adjustment"]
    assert store.account("ada", T0).balance_micro == sum(t.amount_micro for t in txs)
    assert store.account("ada", T0).balance_micro == 2_500_000


def test_price_is_fixed_at_start_by_the_version_in_force(store):
    store.sync_price_book(T0)
    store.start_session("s1", "ada", "", "RTX-4090", 2, T0, T0)
    later = T0 + timedelta(minutes=10)
    record, created = store.publish_price_book(
        make_price_book({"RTX-4090": "50.00", "cpu": "0.10"}), "root", "admin", later
    )
    assert created and record.version == 2
    assert store.publish_price_book(record.book, "root", "admin", later)[1] is False
    stopped = store.stop_session("s1", T0 + timedelta(hours=1), T0)
    assert stopped.price_per_hour_micro == 5_000_000 and stopped.price_book_version == 1
    assert stopped.cost_micro == 10_000_000
    # a session that started before version 2 (the meter saw it late) keeps version 1's price
    early, _ = store.start_session(
        "s2", "ada", "", "RTX-4090", 1, later - timedelta(seconds=1), later
    )
    assert early.price_per_hour_micro == 5_000_000
    new, _ = store.start_session("s3", "ada", "", "RTX-4090", 1, later, later)
    assert (new.price_per_hour_micro, new.price_book_version) == (50_000_000, 2)
    # the settings did not change: a restart keeps the admin's version in force
    assert store.sync_price_book(later).version == 2


def test_running_cost_moves_with_the_clock(store):
    store.start_session("s1", "ada", "", "RTX-4090", 1, T0, T0)
    state = store.account("ada", T0)
    assert state.running_cost_at(T0) == 0
    assert state.running_cost_at(T0 + timedelta(minutes=30)) == 2_500_000
    assert state.available_at(T0 + timedelta(minutes=30)) == 7_500_000
    assert state.rate_per_hour_micro == 5_000_000
    assert state.running[0].seconds_at(T0 + timedelta(seconds=90, milliseconds=500)) == 90


def test_sessions_filter_newest_first(store):
    store.start_session("a", "ada", "one", "cpu", 1, T0, T0)
    store.start_session("b", "ada", "two", "cpu", 1, T0 + timedelta(minutes=1), T0)
    store.start_session("c", "bob", "", "cpu", 1, T0, T0)
    store.stop_session("a", T0 + timedelta(minutes=2), T0)
    assert [s.id for s in store.sessions("ada")] == ["b", "a"]
    assert [s.id for s in store.sessions("ada", "running")] == ["b"]
    assert [s.id for s in store.sessions("ada", "ended")] == ["a"]
    assert {s.id for s in store.sessions(None)} == {"a", "b", "c"}
    assert [s.id for s in store.sessions("ada", since=T0 + timedelta(minutes=3))] == ["b"]
    assert [a.username for a in store.accounts_with_running_sessions(T0)] == ["ada", "bob"]


def test_the_ledger_check_finds_tampering(store):
    store.start_session("s1", "ada", "", "T4", 1, T0, T0)
    store.stop_session("s1", T0 + timedelta(hours=1), T0)
    with store.engine.begin() as db:
        db.exec_driver_sql(
            "UPDATE ledger_accounts SET balance_micro = balance_micro + 1 "
            "WHERE code = 'user:ada:trial'"
        )
        db.exec_driver_sql("UPDATE sessions SET charged_micro = 1 WHERE id = 's1'")
    problems = [p.what for p in store.check_ledger()]
    assert problems == [
        "balance differs",
        "books do not sum to zero",
        "session charges differ",
        "ended session not settled",
    ]
    with store.engine.begin() as db:
        db.exec_driver_sql(
            "UPDATE ledger_accounts SET balance_micro = balance_micro - 1 "
            "WHERE code = 'user:ada:trial'"
        )
        db.exec_driver_sql("UPDATE sessions SET charged_micro = 1500000 WHERE id = 's1'")


def test_a_retried_admission_answers_with_the_same_hold(store):
    store.open_account("ada", T0)
    store.adjust("ada", 500_000 - 10_000_000, "leave 0.50", "k1", T0)
    first = store.admit("ada", "RTX-4090", 1, T0, idempotency_key="spawn-1")
    again = store.admit("ada", "RTX-4090", 1, T0, idempotency_key="spawn-1")
    assert first.allowed and again.allowed and again.hold == first.hold
    assert first.hold.id == "spawn-1" and store.account("ada", T0).held_micro == 416_666
    assert not store.admit("ada", "RTX-4090", 1, T0, idempotency_key="spawn-2").allowed
    # a key is one request's: reused for another account it is a conflict (docs/security.md)
    with pytest.raises(Conflict, match="already used for another request"):
        store.admit("bob", "T4", 1, T0, idempotency_key="spawn-1")


def test_a_username_with_a_colon_cannot_reach_another_users_pools(store):
    store.open_account("a", T0)
    store.open_account("a:allowance", T0)
    assert store.account("a", T0).pools == {"user:a:trial": 10_000_000, "user:a:paid": 0}
    assert store.account("a:allowance", T0).pools == {
        "user:a%3Aallowance:trial": 10_000_000,
        "user:a%3Aallowance:paid": 0,
    }


def test_a_start_after_the_meter_opened_the_session_still_releases_its_hold(store):
    store.open_account("ada", T0)
    admission = store.admit("ada", "T4", 1, T0)
    store.start_session("s1", "ada", "", "T4", 1, T0, T0)  # the pod meter, first
    _, created = store.start_session("s1", "ada", "", "T4", 1, T0, T0, hold_id=admission.hold.id)
    assert not created and store.holds("ada", T0) == []


@pytest.mark.parametrize("path", ["interval", "stop"])
def test_a_charge_that_does_not_balance_is_refused_and_writes_nothing(store, monkeypatch, path):
    """Interval charges and a stop's final charge meet the same check: a split that lost a
    micro-credit (a bug) is refused before anything is written, and the books stay balanced."""
    store.start_session("s1", "ada", "", "RTX-4090", 1, T0, T0)
    split = ledger.split_charge

    def loses_one(amount, balances):
        parts = split(amount, balances)
        return [*parts[:-1], parts[-1] - 1]

    monkeypatch.setattr(ledger, "split_charge", loses_one)
    at = T0 + timedelta(seconds=95)
    with pytest.raises(AssertionError, match="charge:s1:"):
        if path == "interval":
            store.post_interval_charges(at, 30)
        else:
            store.stop_session("s1", at, at)
    assert [t.kind for t in store.transactions("ada")] == ["trial"]
    assert store.account("ada", at).balance_micro == 10_000_000
    assert store.revenue_micro() == 0
