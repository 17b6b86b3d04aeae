"""Team names as people type them, through the real hub and GitHubOAuthenticator against the
GitHub stand-in: `courses.instructor_teams: [Acme:ML-Staff]` lets the members of acme:ml-staff
create courses, and a course bound to `Acme:DL-2026` enrols that team's members at login."""

import pytest
import requests

from tests.github_sim import GitHubSim
from tests.github_sim.client import sign_in
from tests.github_sim.hub import hub_settings
from tests.platform import Platform


@pytest.fixture(scope="module")
def github():
    sim = GitHubSim()
    for login in ("hana", "ivan", "jon"):
        sim.add_user(login)
    sim.add_org("Acme", members=["jon"])
    sim.add_team("Acme", "ml-staff", name="ML Staff", members=["hana"])
    sim.add_team("Acme", "dl-2026", name="DL 2026", members=["ivan"])
    with sim.in_thread():
        yield sim


@pytest.fixture(scope="module")
def hub(tmp_path_factory, github):
    # as an instructor would copy it from the team's page: the organization's display case
    extra = {**hub_settings(github), "courses": {"instructor_teams": ["Acme:ML-Staff"]}}
    p = Platform(tmp_path_factory.mktemp("github-teams"), extra=extra)
    p.start()
    yield p
    p.shutdown()


def signed_in(hub, login):
    """`login` signed in through GitHub; a session calling billing's API with their token."""
    r = sign_in(requests.Session(), f"{hub.url}/hub/oauth_login", login)
    assert r.status_code == 200, r.text
    api = requests.Session()
    api.headers["Authorization"] = f"token {hub.user_token(login)}"
    return api


def courses(api, hub, method="GET", body=None):
    return api.request(method, f"{hub.url}/services/billing/api/courses", json=body, timeout=30)


def test_a_team_typed_in_display_case_makes_its_members_instructors(hub):
    hana = signed_in(hub, "hana")
    assert hub.get("/users/hana").json()["groups"] == ["acme:ml-staff"]
    course = {"name": "Deep Learning", "allowed": ["T4"], "github_team": "Acme:DL-2026"}
    r = courses(hana, hub, "POST", course)
    assert r.status_code == 201, r.text
    assert r.json()["github_team"] == "acme:dl-2026"

    # the team's members are its students from their first login
    ivan = signed_in(hub, "ivan")
    assert [c["slug"] for c in courses(ivan, hub).json()["courses"]] == ["deep-learning"]

    # a member of the organization outside the team is no instructor
    jon = signed_in(hub, "jon")
    r = courses(jon, hub, "POST", {"name": "Mine", "allowed": ["T4"]})
    assert r.status_code == 403 and "Only instructors" in r.json()["message"]


def test_a_course_team_given_by_its_display_name_is_refused_with_its_slug(hub):
    hana = signed_in(hub, "hana")
    r = courses(hana, hub, "POST", {"name": "X", "allowed": ["T4"], "github_team": "Acme:DL 2026"})
    assert r.status_code == 400
    assert r.json()["message"] == (
        "github_team must be 'org:team-slug', not 'Acme:DL 2026'; use the team's slug as in "
        "its URL, github.com/orgs/acme/teams/dl-2026: acme:dl-2026"
    )
