"""The stand-in is as strict as GitHub where gputap depends on it: organizations that restrict
OAuth apps, SAML SSO, nested teams, faults, renames, names with '_' and '.', the registered
callback, and the ghe.com host layout."""

import time
from urllib.parse import parse_qs, urlsplit

import pytest
import requests

from tests.github_sim import GitHubSim
from tests.github_sim.test_github_sim import authorize, exchange

JSON = {"Accept": "application/json"}


def token(github, login, scope="read:org"):
    return exchange(github, authorize(github, login, scope)["code"]).json()["access_token"]


def get(github, path, tok, **params):
    return requests.get(
        f"{github.api_url}{path}",
        headers={"Authorization": f"Bearer {tok}", **JSON},
        params=params,
        timeout=10,
    )


@pytest.fixture
def github():
    sim = GitHubSim()
    for login in ("alice", "bob", "jo_smith", "ta"):
        sim.add_user(login)
    sim.add_org("acme", members=["alice", "bob"])
    sim.add_team("acme", "staff", members=["bob"])
    sim.add_team("acme", "tas", members=["ta"], parent="staff")
    sim.add_team("acme", "ml.course_2026", members=["jo_smith"], parent="tas")
    sim.add_org("initech", members=["alice"], restricts_apps=True)
    sim.add_team("initech", "lab", members=["alice"])
    with sim.in_thread():
        yield sim


def test_an_org_that_restricts_apps_hides_its_data_but_not_the_users_membership(github):
    alice = token(github, "alice")
    assert [t["organization"]["login"] for t in get(github, "/user/teams", alice).json()] == []
    assert [o["login"] for o in get(github, "/user/orgs", alice).json()] == ["acme"]
    for path in ("/orgs/initech/members/alice", "/orgs/initech/teams/lab/members/alice"):
        r = get(github, path, alice)
        assert r.status_code == 403
        assert (
            "the `initech` organization has enabled OAuth App access restrictions"
            in (r.json()["message"])
        )
    memberships = get(github, "/user/memberships/orgs", alice).json()
    assert [(m["organization"]["login"], m["state"]) for m in memberships] == [
        ("acme", "active"),
        ("initech", "active"),
    ]
    assert get(github, "/user/memberships/orgs/initech", alice).status_code == 200
    assert get(github, "/user/memberships/orgs/initech", token(github, "bob")).status_code == 404

    github.approve_app("initech")
    assert get(github, "/orgs/initech/teams/lab/members/alice", alice).status_code == 204
    assert [t["slug"] for t in get(github, "/user/teams", alice).json()] == ["lab"]


def test_saml_sso_needs_the_token_authorized_for_the_org(github):
    github.require_saml("acme")
    bob = token(github, "bob")
    r = get(github, "/orgs/acme/teams/staff/members/bob", bob)
    assert r.status_code == 403
    assert r.json()["message"].startswith("Resource protected by organization SAML enforcement")
    assert r.headers["X-GitHub-SSO"].startswith(f"required; url={github.url}/orgs/acme/sso?")
    teams = get(github, "/user/teams", bob)
    assert teams.json() == []
    assert teams.headers["X-GitHub-SSO"].startswith("partial-results; organizations=")
    github.authorize_sso("bob", "acme")
    assert get(github, "/orgs/acme/teams/staff/members/bob", bob).status_code == 204


def test_nested_teams_direct_lists_and_members_counted_down_the_tree(github):
    jo = token(github, "jo_smith")
    [team] = get(github, "/user/teams", jo).json()  # direct teams only
    assert (team["slug"], team["parent"]["slug"]) == ("ml.course_2026", "tas")
    assert "parent" not in team["parent"]  # team-simple: ask for the parent to go up
    tas = get(github, "/orgs/acme/teams/tas", jo).json()
    assert tas["parent"]["slug"] == "staff"
    assert get(github, "/orgs/acme/teams/staff", jo).json()["parent"] is None
    bob = token(github, "bob")
    for slug in ("staff", "tas", "ml.course_2026"):
        assert get(github, f"/orgs/acme/teams/{slug}/members/jo_smith", bob).status_code == 204
    assert get(github, "/orgs/acme/teams/tas/members/bob", bob).status_code == 404
    membership = get(github, "/orgs/acme/teams/staff/memberships/jo_smith", bob).json()
    assert (membership["state"], membership["role"]) == ("active", "member")


def test_faults_by_path_with_rate_limit_headers_and_delays(github):
    alice = token(github, "alice")
    github.fail("/api/v3/user/teams", 429, times=1, retry_after=30)
    r = get(github, "/user/teams", alice)
    assert r.status_code == 429
    assert r.headers["Retry-After"] == "30" and r.headers["X-RateLimit-Remaining"] == "0"
    assert int(r.headers["X-RateLimit-Reset"]) >= time.time() + 25
    assert get(github, "/user/teams", alice).status_code == 200  # times=1
    github.fail("/api/v3/orgs/*", 403, rate_limited=True)
    r = get(github, "/orgs/acme/members/alice", alice)
    assert r.status_code == 403 and "API rate limit exceeded" in r.json()["message"]
    github.clear_faults()
    github.fail("/api/v3/user", 503)
    assert get(github, "/user", alice).status_code == 503
    github.clear_faults()
    github.fail("/login/oauth/access_token", None, delay=2.0)
    code = authorize(github, "bob")["code"]
    with pytest.raises(requests.Timeout):
        requests.post(
            f"{github.url}/login/oauth/access_token",
            data={"client_id": github.client_id, "client_secret": github.client_secret,
                  "code": code},
            headers=JSON,
            timeout=0.5,
        )  # fmt: skip


def test_a_rename_keeps_the_id_and_frees_the_old_login(github):
    alice = token(github, "alice")
    before = get(github, "/user", alice).json()
    github.rename_user("alice", "alice-new")
    after = get(github, "/user", alice).json()
    assert (after["login"], after["id"]) == ("alice-new", before["id"])
    assert get(github, "/orgs/acme/members/alice-new", alice).status_code == 204
    newcomer = github.add_user("alice")
    assert newcomer.id != before["id"]
    assert get(github, "/user", token(github, "alice")).json()["id"] == newcomer.id


def test_only_the_registered_callback_and_its_sub_paths_on_its_host(github):
    def redirect(uri):
        page = requests.get(
            f"{github.url}/login/oauth/authorize",
            params={"client_id": github.client_id, "redirect_uri": uri, "login": "bob"},
            allow_redirects=False,
            timeout=5,
        )
        return page.status_code, urlsplit(page.headers.get("Location", ""))

    # loopback: any port; the path must be the callback's or below it
    for uri in (
        "http://127.0.0.1:8123/hub/oauth_callback",
        "http://127.0.0.1:9/hub/oauth_callback/x",
    ):
        status, location = redirect(uri)
        assert status == 302 and "code" in parse_qs(location.query), uri
    for uri in (
        "http://127.0.0.1:8123/hub/other",
        "https://127.0.0.1/hub/oauth_callback",
        "http://evil.example/hub/oauth_callback",
        "http://127.0.0.1/hub/oauth_callback/../../steal",
    ):
        status, location = redirect(uri)
        assert "error=redirect_uri_mismatch" in location.query, uri
        assert location.netloc == "127.0.0.1" and location.path == "/hub/oauth_callback", uri
    github.register_callback("https://hub.example.org/hub/oauth_callback")
    status, location = redirect("https://hub.example.org:8443/hub/oauth_callback")
    assert "error=redirect_uri_mismatch" in location.query  # not loopback: the port counts
    github.register_callback("")
    status, _ = redirect("http://127.0.0.1/hub/oauth_callback")
    assert status == 400


def test_the_ghe_com_layout_serves_the_api_at_the_root_of_its_own_host():
    sim = GitHubSim(layout="ghe.com")
    sim.add_user("alice")
    with sim.in_thread():
        assert sim.api_url != sim.url and not sim.api_url.endswith("/api/v3")
        alice = token(sim, "alice")
        me = requests.get(f"{sim.api_url}/user", headers={"Authorization": f"token {alice}"},
                          timeout=5)  # fmt: skip
        assert me.json()["login"] == "alice"
        assert me.json()["html_url"] == f"{sim.url}/alice"
        assert requests.get(f"{sim.url}/api/v3/user", timeout=5).status_code == 404
