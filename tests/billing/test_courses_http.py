"""The courses API through the real hub: every course and usage endpoint for a student,
another student, the course's instructor, another course's instructor and an admin."""

import pytest

from .hub import user


@pytest.fixture(scope="module")
def people(hub, as_ops):
    admin = as_ops
    who = {name: user(hub, name) for name in ("prof", "prof2", "stu", "other")}
    hub.platform.create_user("newbie")  # students an instructor adds are users of the hub
    for name in ("prof", "prof2"):
        assert admin("PUT", f"api/instructors/{name}").status_code == 201
    a = who["prof"](
        "POST", "api/courses", json={"name": "Intro to DL", "allowed": ["T4", "A100-80GB/1g.10gb"]}
    )
    assert a.status_code == 201, a.text
    b = who["prof2"](
        "POST", "api/courses", json={"name": "Vision", "allowed": ["T4"], "slug": "vision"}
    )
    assert b.status_code == 201, b.text
    assert (
        who["stu"]("POST", "api/courses/join", json={"code": a.json()["join_code"]}).status_code
        == 200
    )
    assert (
        who["other"]("POST", "api/courses/join", json={"code": b.json()["join_code"]}).status_code
        == 200
    )
    return {"admin": admin, **who, "code": a.json()["join_code"]}


# (method, path, body) of every endpoint about course intro-to-dl or stu's course hours
ENDPOINTS = {
    "course": ("GET", "api/courses/intro-to-dl", None),
    "students": ("GET", "api/courses/intro-to-dl/students", None),
    "usage": ("GET", "api/courses/intro-to-dl/usage", None),
    "usage.csv": ("GET", "api/courses/intro-to-dl/usage.csv", None),
    "grant": (
        "POST",
        "api/courses/intro-to-dl/grants",
        {"username": "stu", "hours": 1, "reason": "x"},
    ),
    "add student": ("POST", "api/courses/intro-to-dl/students", {"username": "newbie"}),
    "stu's hours": ("GET", "api/accounts/stu/courses", None),
}
ALLOWED = {
    "stu": {"course", "stu's hours"},
    "other": set(),
    "prof": {"course", "students", "usage", "usage.csv", "grant", "add student"},
    "prof2": set(),
    "admin": {"course", "students", "usage", "usage.csv", "grant", "add student", "stu's hours"},
}


@pytest.mark.parametrize("who", sorted(ALLOWED))
def test_the_authorization_matrix_leaks_nothing(people, who):
    for n, (endpoint, (method, path, body)) in enumerate(sorted(ENDPOINTS.items())):
        if body is not None and "reason" in body:
            body = {**body, "idempotency_key": f"{who}-{n}"}
        r = people[who](method, path, json=body)
        if endpoint in ALLOWED[who]:
            assert r.status_code in (200, 201), (who, endpoint, r.text)
        else:
            assert r.status_code in (403, 404), (who, endpoint, r.status_code, r.text)
            assert "Intro to DL" not in r.text and people["code"] not in r.text
    listed = people[who]("GET", "api/courses").json()["courses"]
    names = {c["slug"]: c for c in listed}
    if who in ("prof", "admin"):
        assert names["intro-to-dl"]["join_code"] == people["code"]
    elif who == "stu":
        assert set(names) == {"intro-to-dl"} and "join_code" not in names["intro-to-dl"]
    else:
        assert "intro-to-dl" not in names


def test_the_course_view_a_student_gets_and_their_hours(people):
    course = people["stu"]("GET", "api/courses/intro-to-dl").json()
    assert "join_code" not in course and "github_team" not in course
    [mine] = people["stu"]("GET", "api/accounts/stu/courses").json()["courses"]
    assert mine["hours_left"]["T4"] >= 6.0 and mine["fallback"] is False
    r = people["stu"]("PUT", "api/courses/intro-to-dl/enrollment", json={"fallback": True})
    assert r.status_code == 200 and r.json()["fallback"] is True
    assert (
        people["other"](
            "PUT", "api/courses/intro-to-dl/enrollment", json={"fallback": True}
        ).status_code
        == 404
    )


@pytest.mark.parametrize(
    "body, says",
    [
        (
            {"name": "X", "allowed": ["T4"], "weekly_hours": -3},
            "weekly_hours must be from 0 to 168",
        ),
        (
            {"name": "X", "allowed": ["T4"], "weekly_hours": 1e9},
            "weekly_hours must be from 0 to 168",
        ),
        ({"name": "X", "allowed": "T4"}, "allowed must be a non-empty list"),
        ({"name": "X", "allowed": ["B200"]}, "has no price"),
        (
            {"name": "X", "allowed": ["T4"], "github_team": "acme"},
            "github_team must be 'org:team-slug'",
        ),
        (
            {"name": "X", "allowed": ["T4"], "github_team": "Acme:ML Staff"},
            "github_team must be 'org:team-slug', not 'Acme:ML Staff'; use the team's slug as "
            "in its URL, github.com/orgs/acme/teams/ml-staff: acme:ml-staff",
        ),
        ({"name": "X", "allowed": ["T4"], "max_concurrent_gpus": 10**9}, "max_concurrent_gpus"),
        ({"name": "X", "allowed": ["T4"], "slug": "Bad Slug"}, "slug must be"),
        (
            {"name": "X", "allowed": ["T4"], "environment": "torch"},
            "environment: 'torch' is not one of the hub's environments; choose one of gputap",
        ),
        ({"name": "X", "allowed": ["T4"], "environment": ["gputap"]}, "environment must be"),
        (["not", "an", "object"], "JSON object"),
    ],
)
def test_absurd_courses_are_400_and_change_nothing(people, body, says):
    before = people["prof"]("GET", "api/courses").json()
    r = people["prof"]("POST", "api/courses", json=body)
    assert r.status_code == 400 and says in r.json()["message"], r.text
    assert people["prof"]("GET", "api/courses").json() == before


def test_a_course_team_is_stored_as_the_hub_group(people):
    r = people["prof"](
        "POST",
        "api/courses",
        json={"name": "Teams", "allowed": ["T4"], "github_team": "Acme:DL-2026"},
    )
    assert r.status_code == 201, r.text
    assert r.json()["github_team"] == "acme:dl-2026"
    assert people["prof"]("GET", "api/courses/teams").json()["github_team"] == "acme:dl-2026"


def test_a_course_pins_one_of_the_hubs_environments_and_its_students_see_it(people):
    r = people["prof"](
        "POST",
        "api/courses",
        json={"name": "Pinned", "allowed": ["T4"], "environment": "gputap", "join_code": False},
    )
    assert r.status_code == 201 and r.json()["environment"] == "gputap", r.text
    assert people["prof"]("GET", "api/courses/pinned").json()["environment"] == "gputap"
    assert people["prof"]("POST", "api/courses/pinned/students", json={"username": "stu"}).ok
    taken = people["stu"]("GET", "api/accounts/stu/courses").json()["courses"]
    assert {c["slug"]: c["environment"] for c in taken}["pinned"] == "gputap"
    # a course without a pin: ""
    assert people["prof"]("GET", "api/courses/intro-to-dl").json()["environment"] == ""


def test_only_instructors_create_and_only_admins_make_instructors(people):
    r = people["stu"]("POST", "api/courses", json={"name": "Mine", "allowed": ["T4"]})
    assert r.status_code == 403 and "instructors" in r.json()["message"]
    assert people["prof"]("PUT", "api/instructors/stu").status_code == 403


@pytest.mark.parametrize(
    "name", ["..%2F..%2Fx", "ada%0A", "ada%2Fbob", "ada%20lovelace", "%E2%80%AEada"]
)
def test_an_instructor_must_have_a_login_name(people, as_ops, name):
    r = as_ops("PUT", f"api/instructors/{name}")
    assert r.status_code == 400, r.text
    assert "must be a login name: 1 to 39 of a-z" in r.json()["message"]


def test_an_instructor_is_made_by_login_in_lower_case(as_ops):
    r = as_ops("PUT", "api/instructors/Prof-Ada")
    assert r.status_code == 201 and r.json()["username"] == "prof-ada"


def test_join_codes_are_rate_limited(hub, people):
    guesser = user(hub, "guesser")
    for _ in range(5):
        r = guesser("POST", "api/courses/join", json={"code": "NOTACODE00"})
        assert r.status_code == 400 and "no active course" in r.json()["message"]
    r = guesser("POST", "api/courses/join", json={"code": people["code"]})
    assert r.status_code == 429 and "try again" in r.json()["message"]


def test_archived_courses_take_no_new_servers(people):
    r = people["prof2"](
        "POST", "api/courses", json={"name": "Old", "allowed": ["T4"], "slug": "old"}
    )
    code = r.json()["join_code"]
    assert people["prof"]("POST", "api/courses/old/archive").status_code == 404
    r = people["prof2"]("POST", "api/courses/old/archive")
    assert r.status_code == 200 and r.json()["archived"] is True and r.json()["join_code"] is None
    assert people["stu"]("POST", "api/courses/join", json={"code": code}).status_code == 400
