"""GitHub Enterprise Cloud's layout (`SUB.ghe.com` for the web flow, `api.SUB.ghe.com` for the
REST API, as api.github.com serves github.com): with `hub.github.url` and `hub.github.api_url`
on two ports of the stand-in, the real hub signs people in, and reads teams and memberships
from the API host."""

import pytest
import requests

from tests.github_sim import GitHubSim
from tests.github_sim.client import sign_in
from tests.github_sim.hub import hub_settings
from tests.platform import Platform


@pytest.fixture(scope="module")
def github():
    sim = GitHubSim(layout="ghe.com")
    sim.add_user("kim")
    sim.add_user("lee")
    sim.add_org("octo", members=["lee"])
    sim.add_team("octo", "hub.admins", members=["kim"])
    with sim.in_thread():
        yield sim


@pytest.fixture(scope="module")
def hub(tmp_path_factory, github):
    assert github.api_url != f"{github.url}/api/v3"  # another port, paths at its root
    extra = hub_settings(
        github,
        api_url=github.api_url,
        admin_teams=["Octo:Hub.Admins"],
        allowed_organizations=["octo"],
    )
    p = Platform(tmp_path_factory.mktemp("github-ghe"), extra=extra)
    p.start()
    yield p
    p.shutdown()


def test_sign_in_with_the_api_on_a_host_of_its_own(hub, github):
    before = len(github.requests)
    r = sign_in(requests.Session(), f"{hub.url}/hub/oauth_login", "kim")
    assert r.status_code == 200, r.text
    kim = hub.get("/users/kim").json()
    assert kim["admin"] is True and kim["groups"] == ["octo:hub.admins"]
    paths = {path for _, path in github.requests[before:]}
    assert {"/user", "/user/teams"} <= paths  # at the API host's root
    assert not [p for p in paths if p.startswith("/api/v3")]

    r = sign_in(requests.Session(), f"{hub.url}/hub/oauth_login", "lee")
    assert r.status_code == 200, r.text  # a member of the allowed organization
    assert hub.get("/users/lee").json()["admin"] is False
