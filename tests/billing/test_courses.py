"""Courses in billing: rules, weeks, admission, per-second allowance, the weekly split."""

from datetime import UTC, datetime, timedelta

import pytest

from billing_service.domain.courses import course_rules, week_of
from billing_service.domain.enforcement import sessions_to_stop
from billing_service.domain.errors import JoinRateLimited
from billing_service.loops.charge import charge_pass

from .conftest import T0

SKUS = {"RTX-4090", "T4", "A100-80GB", "A100-80GB/1g.10gb", "cpu"}
# T0 is Wednesday 2025-01-01 12:00 UTC; the default week starts Monday 00:00 UTC
MONDAY = datetime(2025, 1, 6, tzinfo=UTC)


@pytest.fixture(autouse=True)
def books_balance(store):
    yield
    assert [str(p) for p in store.check_ledger()] == []


def make_course(store, slug="dl101", **rules):
    body = {"name": "Intro to DL", "allowed": ["A100-80GB/1g.10gb", "T4"], **rules}
    return store.create_course("prof", course_rules(body, SKUS), slug, T0, join_code=True)


@pytest.mark.parametrize(
    "body, says",
    [
        ({"weekly_hours": -1}, "weekly_hours must be from 0 to 168"),
        ({"weekly_hours": 10_000}, "weekly_hours must be from 0 to 168"),
        ({"weekly_hours": "6h"}, "weekly_hours must be a number"),
        ({"allowed": []}, "allowed must be a non-empty list"),
        ({"allowed": ["B200"]}, "'B200' has no price"),
        ({"allowed": ["T4; drop"]}, "is not an option"),
        ({"max_concurrent_gpus": 0}, "max_concurrent_gpus must be a whole number"),
        ({"budget_cap": "-5"}, "budget_cap must be positive"),
        ({"github_team": "no-colon"}, "github_team must be 'org:team-slug'"),
        # names are matched whole: a newline inside is no team
        ({"github_team": "acme:ml-\nstaff"}, "github_team must be 'org:team-slug'"),
        (
            {"github_team": "Acme:ML Staff"},
            "use the team's slug as in its URL, github.com/orgs/acme/teams/ml-staff: acme:ml-staff",
        ),
        ({"reset_weekday": "someday"}, "reset_weekday must be one of"),
        ({"reset_time": "25:00"}, "reset_time must be HH:MM"),
        ({"timezone": "Mars/Olympus"}, "timezone must be an IANA name"),
        ({"name": ""}, "name must be a non-empty string"),
        ({"name": "Intro\nto DL"}, "name must be .* without control characters"),
        ({"name": "DL\x00"}, "name must be .* without control characters"),
        ({"name": "DL\u202e101"}, "name must be .* without control characters"),
        ({"name": "../.."}, "name must be .* with a letter or digit"),
        ({"environment": "torch"}, "'torch' is not one of the hub's environments"),
        ({"environment": "Torch!"}, "environment must be the key of one of the hub's"),
        ({"environment": 3}, "environment must be the key of one of the hub's"),
    ],
)
def test_absurd_rules_are_refused_with_the_reason(body, says):
    with pytest.raises(ValueError, match=says):
        course_rules({"name": "X", "allowed": ["T4"], **body}, SKUS)


def test_weeks_follow_the_course_timezone_across_daylight_saving():
    # Berlin, Sunday 20:00 local: CET (+1) before 30 March 2025, CEST (+2) after
    start, end = week_of(
        datetime(2025, 3, 26, tzinfo=UTC), 6, datetime(1, 1, 1, 20).time(), "Europe/Berlin"
    )
    assert start == datetime(2025, 3, 23, 19, tzinfo=UTC)
    assert end == datetime(2025, 3, 30, 18, tzinfo=UTC)  # 167 hours: the clocks went forward
    assert week_of(end, 6, datetime(1, 1, 1, 20).time(), "Europe/Berlin")[0] == end


def test_a_student_spawns_an_allowed_slice_on_the_course_and_not_another_card(store):
    make_course(store)
    store.enroll("dl101", "stu", "team", T0)
    ok = store.admit("stu", "A100-80GB/1g.10gb", 1, T0, course="dl101")
    assert ok.allowed and ok.hold.amount_micro == 95_238  # 5 min of 1.142857/h
    with pytest.raises(ValueError) as refused:
        store.admit("stu", "A100-80GB", 1, T0, course="dl101")
    assert str(refused.value) == (
        "Intro to DL pays for A100-80GB/1g.10gb, T4 only, not A100-80GB. Pick one of those, "
        "or start without the course to pay with your own credit."
    )
    with pytest.raises(ValueError, match="allows 1 GPU"):
        store.admit("stu", "T4", 1, T0, course="dl101")  # the slice's hold counts
    with pytest.raises(ValueError, match="you take no active course .dl101."):
        store.admit("other", "T4", 1, T0, course="dl101")
    [view] = store.student_courses("stu", T0)
    # 6 h of the dearest allowed option (T4, 1.50/h) = 9.00 this week
    assert view.left_micro == 9_000_000
    assert view.hours_left("T4") == 6.0 and round(view.hours_left("A100-80GB/1g.10gb"), 3) == 7.875


def test_allowance_drains_per_second_and_the_week_boundary_splits_a_session_exactly(store):
    make_course(store, weekly_hours=1, allowed=["T4"])  # 1.50 a week
    store.enroll("dl101", "stu", "team", T0)
    start = MONDAY - timedelta(minutes=30)
    store.admit("stu", "T4", 1, start, course="dl101")
    store.start_session("c1", "stu", "", "T4", 1, start, start, course="dl101")
    # drains by the second: 10 min = 0.25
    store.roll_course_weeks(start + timedelta(minutes=10))
    store.post_interval_charges(start + timedelta(minutes=10), 30)
    assert store.account("stu", start).pools["user:stu:allowance:dl101"] == 1_250_000
    # 45 min after the boundary (the charge loop rolls the week first)
    store.roll_course_weeks(MONDAY + timedelta(minutes=45))
    store.post_interval_charges(MONDAY + timedelta(minutes=45), 30)
    stopped = store.stop_session(
        "c1", MONDAY + timedelta(minutes=45), MONDAY + timedelta(minutes=45)
    )
    assert stopped.billed_seconds == 4500 and stopped.cost_micro == 1_875_000
    keys = [t.idempotency_key for t in store.transactions("stu")]
    boundary = MONDAY.isoformat()
    split = next(
        t for t in store.transactions("stu") if t.idempotency_key == f"charge:c1:week:{boundary}"
    )
    assert split.amount_micro == -(750_000 - 250_000)  # up to the boundary: 30 min = 0.75
    assert f"allowance-expiry:dl101:stu:{boundary}" in keys  # 0.75 of last week lapses
    assert f"allowance:dl101:stu:{boundary}" in keys
    # the new week paid the 45 minutes after the boundary: 1.50 - 1.125
    assert store.account("stu", MONDAY).pools["user:stu:allowance:dl101"] == 375_000
    course, week1, _, rows = store.roster_usage("dl101", start)
    assert week1 == MONDAY - timedelta(days=7)
    assert rows == [
        {
            "username": "stu",
            "gpu_seconds": 1800,
            "sessions": 1,
            "cost_micro": 750_000,
            "gpu_hours": 0.5,
            "cost": "0.75",
        }
    ]
    assert store.roster_usage("dl101", MONDAY)[3][0]["gpu_seconds"] == 2700


def test_the_charge_loop_rolls_the_week_before_it_charges(store):
    """The charger's pass (loops/charge.py) splits a session at the week's boundary first,
    so the interval charge after it is paid by the new week."""
    make_course(store, weekly_hours=1, allowed=["T4"])  # 1.50 a week
    store.enroll("dl101", "stu", "team", T0)
    start = MONDAY - timedelta(minutes=30)
    store.admit("stu", "T4", 1, start, course="dl101")
    store.start_session("c1", "stu", "", "T4", 1, start, start, course="dl101")
    at = MONDAY + timedelta(minutes=45)
    assert charge_pass(store, at, 30, 200, 1) == (1, 1)  # posted, running
    boundary = MONDAY.isoformat()
    assert [t.idempotency_key for t in store.transactions("stu")][-4:] == [
        f"charge:c1:week:{boundary}",
        f"allowance-expiry:dl101:stu:{boundary}",
        f"allowance:dl101:stu:{boundary}",
        "charge:c1:150",
    ]
    # the new week paid the 45 minutes after the boundary: 1.50 - 1.125
    assert store.account("stu", at).pools["user:stu:allowance:dl101"] == 375_000


def test_out_of_course_hours_stops_unless_the_student_pays_on(store):
    make_course(store, weekly_hours=0.1, allowed=["T4"])  # 6 min of T4 = 0.15
    store.enroll("dl101", "stu", "team", T0)
    store.enroll("dl101", "pay", "team", T0)
    store.set_fallback("dl101", "pay", True)
    for user in ("stu", "pay"):
        store.start_session(f"s-{user}", user, "", "T4", 1, T0, T0, course="dl101")
    at = T0 + timedelta(minutes=5, seconds=56)  # 4 s of course hours left each
    accounts = store.accounts_with_running_sessions(at)
    assert [s.id for s in sessions_to_stop(accounts, at, 5)] == ["s-stu"]
    state = next(a for a in accounts if a.username == "stu")
    from billing_service.handlers.views import account_view

    [warning] = account_view(state, at, "credits", (900, 300))["warnings"]
    assert warning["course"] == "dl101" and warning["threshold_seconds"] == 300
    assert warning["message"].startswith("About 4 s of course dl101 hours this week left")
    # the student who opted in goes on with trial credit after the allowance
    stopped = store.stop_session("s-pay", T0 + timedelta(minutes=10), at)
    pools = store.account("pay", at).pools
    assert stopped.cost_micro == 250_000
    assert pools["user:pay:allowance:dl101"] == 0 and pools["user:pay:trial"] == 9_900_000
    # without opting in, the allowance alone takes the overrun (the course's loss)
    store.stop_session("s-stu", T0 + timedelta(minutes=6, seconds=10), at)
    assert store.account("stu", at).pools["user:stu:allowance:dl101"] == -4_166
    assert store.account("stu", at).pools["user:stu:trial"] == 10_000_000
    refused = store.admit("stu", "T4", 1, at, course="dl101")
    assert not refused.allowed and refused.message.startswith("No Intro to DL hours left this week")


def test_join_codes_are_rate_limited_and_archived_courses_take_no_one(store):
    course = make_course(store)
    for _ in range(5):
        with pytest.raises(ValueError, match="no active course has that join code"):
            store.join("mallory", "WRONGCODE1", T0)
    with pytest.raises(JoinRateLimited, match="try again in 15 minutes"):
        store.join("mallory", course.join_code, T0)
    assert store.join("mallory", course.join_code, T0 + timedelta(minutes=16)).slug == "dl101"
    assert store.join("alice", course.join_code, T0).slug == "dl101"
    store.archive_course("dl101", T0)
    with pytest.raises(ValueError, match="no active course"):
        store.admit("alice", "T4", 1, T0, course="dl101")
    with pytest.raises(ValueError):
        store.join("bob", course.join_code, T0)


def test_a_course_team_is_kept_as_the_hub_group_it_must_match(store):
    """Groups are lower-case org:team-slug; a team typed as GitHub shows it must match them."""
    for typed in ("Acme:DL-2025", " acme:dl-2025\n"):
        assert course_rules(
            {"name": "X", "allowed": ["T4"], "github_team": typed}, SKUS
        ).github_team == ("acme:dl-2025")
    make_course(store, github_team="Acme:DL-2025", allowed=["T4"])
    assert store.course("dl101").github_team == "acme:dl-2025"
    assert store.enroll_by_groups("ann", ["acme:dl-2025"], T0) == ["dl101"]


def test_team_binding_enrols_at_login_and_the_budget_cap_limits_grants(store):
    make_course(store, github_team="acme:dl-2025", budget_cap="12.00", allowed=["T4"])
    assert store.enroll_by_groups("ann", ["acme:dl-2025", "acme:other"], T0) == ["dl101"]
    assert store.enroll_by_groups("ann", ["acme:dl-2025"], T0) == []  # already a student
    store.enroll_by_groups("ben", ["acme:dl-2025"], T0)
    # 9.00 a week each; the cap of 12.00 leaves ben 3.00
    lefts = {v.course.slug: v.left_micro for v in store.student_courses("ann", T0)}
    assert lefts == {"dl101": 9_000_000}
    assert store.student_courses("ben", T0)[0].left_micro == 3_000_000


def test_instructors_grant_extra_hours_once_per_key(store):
    make_course(store, allowed=["T4"])
    store.enroll("dl101", "stu", "instructor", T0)
    tx, created = store.extra_hours("dl101", "stu", 2, "project", "x1", "prof", T0)
    again, created_again = store.extra_hours("dl101", "stu", 2, "project", "x1", "prof", T0)
    assert created and not created_again and again == tx
    assert tx.amount_micro == 3_000_000 and tx.created_by == "prof"
    assert store.student_courses("stu", T0)[0].left_micro == 12_000_000
    with pytest.raises(ValueError, match="not a student"):
        store.extra_hours("dl101", "nobody", 1, "x", "x2", "prof", T0)


def test_an_unused_allowance_does_not_keep_a_server_running_on_no_credit(store):
    """A course's allowance pays only that course's sessions: a server outside it is stopped
    when the user's own credit runs out (it used to run on, the paid pool sinking unbounded)."""
    store.open_account("stu", T0)
    store.grant("stu", "allowance", 3_000_000, "week 1", "a1", T0, course="dl101")
    store.adjust("stu", -10_000_000, "no trial", "k1", T0)
    store.start_session("s1", "stu", "", "T4", 1, T0, T0)  # not a course session
    now = T0 + timedelta(seconds=10)
    assert [s.id for s in sessions_to_stop([store.account("stu", now)], now, 5)] == ["s1"]
    store.stop_session("s1", now, now)
