"""GitHub login with the real GitHubOAuthenticator inside the real hub, against the GitHub
stand-in (tests/github_sim): sign-up with trial credit, organization restrictions, teams as
groups (across pages), admins by team."""

import pytest
import requests

from tests.conftest import github_platform
from tests.github_sim.client import sign_in


@pytest.fixture(scope="module")
def restricted_hub(tmp_path_factory, github):
    p = github_platform(
        tmp_path_factory.mktemp("github-restricted"),
        github,
        allowed_organizations=["initech", "acme:gpu-users"],
    )
    yield p
    p.shutdown()


def login(platform, name):
    session = requests.Session()
    r = sign_in(session, f"{platform.url}/hub/oauth_login", name)
    return session, r


def test_any_github_user_signs_up_and_gets_trial_credit(github_hub):
    assert github_hub.get("/users/bob").status_code == 404
    session, r = login(github_hub, "bob")
    assert r.status_code == 200, r.text
    assert r.url.startswith(f"{github_hub.url}/hub/")
    user = github_hub.get("/users/bob").json()
    assert user["admin"] is False and user["groups"] == []
    account = github_hub.account("bob")  # opened by the post_auth_hook, before any spawn
    assert account["balance_micro"] == 10_000_000
    home = session.get(f"{github_hub.url}/hub/home", timeout=30)
    assert home.status_code == 200 and "bob" in home.text


def test_teams_become_groups_across_pages(github_hub, github):
    before = len(github.requests)
    login(github_hub, "alice")
    team_pages = [path for _, path in github.requests[before:] if path == "/api/v3/user/teams"]
    assert len(team_pages) == 2  # the stand-in pages by 2: the authenticator followed Link

    groups = github_hub.reader.get(f"{github_hub.url}/hub/api/groups", timeout=30).json()
    members = {g["name"]: g["users"] for g in groups}
    for slug in ("a-team", "b-team", "c-team"):
        assert members[f"acme:{slug}"] == ["alice"]
    user = github_hub.reader.get(f"{github_hub.url}/hub/api/users/alice", timeout=30).json()
    assert sorted(user["groups"]) == ["acme:a-team", "acme:b-team", "acme:c-team"]
    teams = user["auth_state"]["teams"]  # encrypted at rest with the generated crypt key
    assert sorted(t["slug"] for t in teams) == ["a-team", "b-team", "c-team"]
    assert user["auth_state"]["github_user"]["login"] == "alice"


def test_admins_by_team_reach_billing_admin(github_hub):
    carol, _ = login(github_hub, "carol")
    assert github_hub.get("/users/carol").json()["admin"] is True
    page = carol.get(f"{github_hub.url}/services/billing/admin", timeout=30)
    assert page.status_code == 200, page.text

    dave, _ = login(github_hub, "dave")
    assert github_hub.get("/users/dave").json()["admin"] is False
    assert dave.get(f"{github_hub.url}/services/billing/admin", timeout=30).status_code == 403


def test_org_restriction_refuses_with_the_reason(restricted_hub):
    _, r = login(restricted_hub, "bob")
    assert r.status_code == 403
    assert "initech, acme:gpu-users" in r.text and "not one of them" in r.text
    assert restricted_hub.get("/users/bob").status_code == 404  # no user was made
    assert restricted_hub.billing("api/accounts/bob").status_code == 404  # and no account


@pytest.mark.parametrize("name", ["erin", "frank"])
def test_members_of_an_allowed_org_or_team_sign_in(restricted_hub, name):
    _, r = login(restricted_hub, name)
    assert r.status_code == 200, r.text
    assert restricted_hub.account(name)["balance_micro"] == 10_000_000
