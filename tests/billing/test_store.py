from dataclasses import replace
from datetime import timedelta

import pytest

from billing_service.pricing import make_price_book
from billing_service.store import NotFound, UnknownSku

from .conftest import T0


def test_trial_credit_is_granted_once(store):
    state, created = store.open_account("ada", T0)
    assert created and state.balance_micro == 10_000_000
    state, created = store.open_account("ada", T0 + timedelta(days=1))
    assert not created and state.balance_micro == 10_000_000
    assert [e.kind for e in store.entries("ada")] == ["trial"]
    assert store.entries("ada")[0].idempotency_key == "trial:ada"


def test_missing_account_is_not_found(store):
    with pytest.raises(NotFound, match="bob"):
        store.account("bob")


def test_admission_at_the_boundary(store):
    store.open_account("ada", T0)
    # 5 minutes of A100-80GB at 8.00/h = 0.666666 credits; leave exactly that
    needed = 8_000_000 * 300 // 3600
    store.adjust("ada", needed - 10_000_000, "test", "k1", T0)
    admission = store.admit("ada", "A100-80GB", 1, T0)
    assert admission.allowed and admission.needed_micro == needed
    assert admission.seconds_left == 299  # 666_666 micro at 8.00/h: 299.99 s
    store.adjust("ada", -1, "one micro less", "k2", T0)
    admission = store.admit("ada", "A100-80GB", 1, T0)
    assert not admission.allowed
    assert admission.message == (
        "Not enough credit for A100-80GB: 5 minutes at 8.00/h needs 0.666666 credits, "
        "you have 0.666665 available. Stop a running server or ask an admin for credit."
    )


def test_admission_counts_running_cost_and_opens_account(store):
    admission = store.admit("new", "cpu", 1, T0)
    assert admission.allowed
    assert store.account("new").balance_micro == 10_000_000
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
    charges = [e for e in store.entries("ada") if e.kind == "charge"]
    assert len(charges) == 1 and charges[0].amount_micro == -10_000_000
    assert charges[0].idempotency_key == "charge:s1"
    assert store.account("ada").balance_micro == 0


def test_stop_refuses_end_before_start_and_unknown(store):
    store.start_session("s1", "ada", "", "T4", 1, T0, T0)
    with pytest.raises(ValueError, match="ended_at"):
        store.stop_session("s1", T0 - timedelta(seconds=1), T0)
    assert store.sessions("ada", "running")[0].ended_at is None
    with pytest.raises(NotFound):
        store.stop_session("nope", T0, T0)


def test_balance_is_sum_of_entries(store):
    store.start_session("s1", "ada", "", "A100-40GB", 1, T0, T0)
    store.stop_session("s1", T0 + timedelta(seconds=5400), T0)
    store.adjust("ada", 2_500_000, "course grant", "grant-1", T0)
    store.adjust("ada", 2_500_000, "double click", "grant-1", T0)
    entries = store.entries("ada")
    assert [e.kind for e in entries] == ["trial", "charge", "adjustment"]
    assert store.account("ada").balance_micro == sum(e.amount_micro for e in entries)
    assert store.account("ada").balance_micro == 2_500_000


def test_price_is_fixed_at_start(store):
    store.start_session("s1", "ada", "", "RTX-4090", 2, T0, T0)
    store.price_book = make_price_book({"RTX-4090": "50.00"})
    stopped = store.stop_session("s1", T0 + timedelta(hours=1), T0)
    assert stopped.price_per_hour_micro == 5_000_000
    assert stopped.cost_micro == 10_000_000


def test_running_cost_moves_with_the_clock(store):
    store.start_session("s1", "ada", "", "RTX-4090", 1, T0, T0)
    state = store.account("ada")
    assert state.running_cost_at(T0) == 0
    assert state.running_cost_at(T0 + timedelta(minutes=30)) == 2_500_000
    assert state.available_at(T0 + timedelta(minutes=30)) == 7_500_000
    assert state.rate_per_hour_micro == 5_000_000
    moved = replace(state.running[0])
    assert moved.seconds_at(T0 + timedelta(seconds=90, milliseconds=500)) == 90


def test_sessions_filter_newest_first(store):
    store.start_session("a", "ada", "one", "cpu", 1, T0, T0)
    store.start_session("b", "ada", "two", "cpu", 1, T0 + timedelta(minutes=1), T0)
    store.start_session("c", "bob", "", "cpu", 1, T0, T0)
    store.stop_session("a", T0 + timedelta(minutes=2), T0)
    assert [s.id for s in store.sessions("ada")] == ["b", "a"]
    assert [s.id for s in store.sessions("ada", "running")] == ["b"]
    assert [s.id for s in store.sessions("ada", "ended")] == ["a"]
    assert {s.id for s in store.sessions(None)} == {"a", "b", "c"}
    assert [a.username for a in store.accounts_with_running_sessions()] == ["ada", "bob"]
