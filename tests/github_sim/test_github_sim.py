"""The GitHub stand-in speaks GitHub's shapes: the OAuth web flow, tokens, pagination,
membership answers and GitHub's refusals."""

import subprocess
import sys
from pathlib import Path
from urllib.parse import parse_qs, urljoin, urlsplit

import pytest
import requests
import yaml

from tests.github_sim import GitHubSim, GitHubState, OAuthError, SimError
from tests.github_sim.client import user_link

CALLBACK = "http://127.0.0.1:9/hub/oauth_callback"
JSON = {"Accept": "application/json"}


@pytest.fixture(scope="module")
def github():
    sim = GitHubSim(max_per_page=2)
    sim.add_user("alice", name="Alice Example", email="alice@example.org")
    sim.add_user("bob", emails=["bob@corp.example", "bob@home.example"])
    sim.add_user("carol")
    sim.add_org("acme", members=["bob"], admins=["alice"], public_members=["carol"])
    for slug in ("a-team", "b-team", "c-team"):
        sim.add_team("acme", slug, members=["alice"])
    sim.add_team("acme", "gpu", members=["carol"], maintainers=["bob"], name="GPU users")
    sim.add_team("acme", "hidden", members=["carol"], privacy="secret")
    sim.add_org("other")
    with sim.in_thread():
        yield sim


def authorize(github, login, scope="read:org", **params):
    """Walk the authorize page as a browser would; return the redirect's query."""
    query = {
        "client_id": github.client_id,
        "redirect_uri": CALLBACK,
        "scope": scope,
        "state": "st4te",
        "response_type": "code",
        **params,
    }
    page = requests.get(f"{github.url}/login/oauth/authorize", params=query, timeout=5)
    assert page.status_code == 200, page.text
    r = requests.get(
        urljoin(page.url, user_link(page.text, login)), allow_redirects=False, timeout=5
    )
    assert r.status_code == 302, r.text
    location = urlsplit(r.headers["Location"])
    assert f"{location.scheme}://{location.netloc}{location.path}" == CALLBACK
    return {k: v[0] for k, v in parse_qs(location.query).items()}


def exchange(github, code, headers=JSON, **params):
    body = {
        "client_id": github.client_id,
        "client_secret": github.client_secret,
        "code": code,
        "redirect_uri": CALLBACK,
        **params,
    }
    return requests.post(
        f"{github.url}/login/oauth/access_token", data=body, headers=headers, timeout=5
    )


def token(github, login, scope="read:org"):
    r = exchange(github, authorize(github, login, scope)["code"])
    return r.json()["access_token"]


def api(github, path, tok=None, scheme="Bearer", **params):
    headers = {"Authorization": f"{scheme} {tok}"} if tok else {}
    return requests.get(f"{github.api_url}{path}", headers=headers, params=params, timeout=5)


def test_authorize_page_is_labelled_and_lists_every_test_user(github):
    page = requests.get(
        f"{github.url}/login/oauth/authorize",
        params={"client_id": github.client_id, "redirect_uri": CALLBACK, "scope": "read:org"},
        timeout=5,
    )
    assert page.status_code == 200
    assert "GitHub stand-in" in page.text and "No GitHub account is involved" in page.text
    assert "read:org" in page.text
    for login in ("alice", "bob", "carol"):
        assert user_link(page.text, login)


def test_picking_a_user_returns_code_and_state_which_buy_one_token(github):
    query = authorize(github, "alice", scope="read:org user:email")
    assert query["state"] == "st4te" and len(query["code"]) == 20

    r = exchange(github, query["code"])
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("application/json")
    body = r.json()
    assert body["token_type"] == "bearer"
    assert body["scope"] == "read:org,user:email"  # GitHub joins granted scopes with commas
    assert body["access_token"].startswith("gho_")

    again = exchange(github, query["code"])  # codes are single use
    assert again.status_code == 200  # GitHub answers token errors with 200
    assert again.json()["error"] == "bad_verification_code"


def test_token_answers_follow_accept_and_take_json_bodies(github):
    form = exchange(github, authorize(github, "bob")["code"], headers={})
    assert form.headers["Content-Type"].startswith("application/x-www-form-urlencoded")
    fields = parse_qs(form.text)
    assert fields["token_type"] == ["bearer"] and fields["access_token"][0].startswith("gho_")

    xml = exchange(github, authorize(github, "bob")["code"], headers={"Accept": "application/xml"})
    assert xml.text.startswith("<OAuth><access_token>gho_")

    code = authorize(github, "bob")["code"]
    r = requests.post(
        f"{github.url}/login/oauth/access_token",
        json={
            "client_id": github.client_id,
            "client_secret": github.client_secret,
            "code": code,
        },
        headers=JSON,
        timeout=5,
    )
    assert r.json()["token_type"] == "bearer"


@pytest.mark.parametrize(
    "change,error",
    [
        ({"code": "not-a-code"}, "bad_verification_code"),
        ({"client_secret": "wrong"}, "incorrect_client_credentials"),
        ({"redirect_uri": "http://127.0.0.1:9/elsewhere"}, "redirect_uri_mismatch"),
        ({"grant_type": "refresh_token"}, "unsupported_grant_type"),
    ],
)
def test_token_refusals_use_githubs_error_codes(github, change, error):
    code = authorize(github, "alice")["code"]
    r = exchange(github, change.pop("code", code), **change)
    assert r.status_code == 200
    body = r.json()
    assert body["error"] == error and body["error_description"]
    assert "access_token" not in body


def test_pkce_verifier_must_match_the_challenge(github):
    from tests.github_sim.state import s256

    challenge = s256("the-verifier")
    query = authorize(github, "alice", code_challenge=challenge, code_challenge_method="S256")
    assert exchange(github, query["code"], code_verifier="wrong").json()["error"] == (
        "bad_verification_code"
    )
    query = authorize(github, "alice", code_challenge=challenge, code_challenge_method="S256")
    assert "access_token" in exchange(github, query["code"], code_verifier="the-verifier").json()


def test_codes_expire_after_ten_minutes():
    now = [1000.0]
    state = GitHubState(clock=lambda: now[0])
    state.add_user("alice")
    code = state.issue_code("alice", state.client_id, ("read:org",), CALLBACK)
    now[0] += 601
    with pytest.raises(OAuthError, match="bad_verification_code"):
        state.exchange_code(state.client_id, state.client_secret, code, CALLBACK)


def test_user_needs_a_valid_token_in_either_scheme(github):
    missing = api(github, "/user")
    assert missing.status_code == 401 and missing.json()["message"] == "Requires authentication"
    bad = api(github, "/user", "gho_unknown")
    assert bad.status_code == 401 and bad.json()["message"] == "Bad credentials"

    tok = token(github, "alice")
    for scheme in ("token", "Bearer"):
        r = api(github, "/user", tok, scheme=scheme)
        assert r.status_code == 200
        assert r.json()["login"] == "alice" and r.json()["email"] == "alice@example.org"
        assert r.headers["X-OAuth-Scopes"] == "read:org"

    github.state.revoke(tok)
    assert api(github, "/user", tok).status_code == 401


def test_private_email_and_the_emails_endpoint_needs_user_email(github):
    tok = token(github, "bob", scope="read:org")
    assert api(github, "/user", tok).json()["email"] is None
    assert api(github, "/user/emails", tok).status_code == 404

    tok = token(github, "bob", scope="user:email")
    emails = api(github, "/user/emails", tok).json()
    assert emails == [
        {"email": "bob@corp.example", "primary": True, "verified": True, "visibility": "private"},
        {"email": "bob@home.example", "primary": False, "verified": True, "visibility": "private"},
    ]


def test_teams_paginate_with_link_headers(github):
    tok = token(github, "alice")
    first = api(github, "/user/teams", tok, per_page=100)  # capped at the stand-in's 2
    assert [t["slug"] for t in first.json()] == ["a-team", "b-team"]
    assert first.json()[0]["organization"]["login"] == "acme"
    links = requests.utils.parse_header_links(first.headers["Link"])
    rels = {link["rel"]: parse_qs(urlsplit(link["url"]).query) for link in links}
    assert set(rels) == {"next", "last"}
    assert rels["next"]["page"] == ["2"] and rels["last"]["page"] == ["2"]
    assert rels["next"]["per_page"] == ["2"]

    second = requests.get(
        [link["url"] for link in links if link["rel"] == "next"][0],
        headers={"Authorization": f"Bearer {tok}"},
        timeout=5,
    )
    assert [t["slug"] for t in second.json()] == ["c-team"]
    rels = {link["rel"] for link in requests.utils.parse_header_links(second.headers["Link"])}
    assert rels == {"prev", "first"}

    one_page = api(github, "/user/teams", token(github, "bob"))
    assert [t["slug"] for t in one_page.json()] == ["gpu"] and "Link" not in one_page.headers


def test_teams_need_read_org(github):
    r = api(github, "/user/teams", token(github, "alice", scope=""))
    assert r.status_code == 403 and "read:org" in r.json()["message"]


def test_org_membership_is_204_or_404_and_private_membership_needs_read_org(github):
    tok = token(github, "alice")  # an owner of acme, with read:org
    assert api(github, "/orgs/acme/members/bob", tok).status_code == 204
    assert api(github, "/orgs/acme/members/alice", tok).status_code == 204
    assert api(github, "/orgs/other/members/alice", tok).status_code == 404
    assert api(github, "/orgs/nope/members/alice", tok).status_code == 404
    assert api(github, "/orgs/acme/members/nobody", tok).status_code == 404
    assert api(github, "/orgs/ACME/members/Bob", tok).status_code == 204  # names ignore case

    no_org_scope = token(github, "alice", scope="")
    assert api(github, "/orgs/acme/members/bob", no_org_scope).status_code == 404  # private
    assert api(github, "/orgs/acme/members/carol", no_org_scope).status_code == 204  # public
    assert api(github, "/orgs/acme/members/carol").status_code == 204  # anonymous


def test_team_membership_and_secret_teams(github):
    tok = token(github, "bob")
    r = api(github, "/orgs/acme/teams/gpu/memberships/bob", tok)
    assert r.status_code == 200 and r.json()["state"] == "active"
    assert r.json()["role"] == "maintainer"
    assert api(github, "/orgs/acme/teams/gpu/memberships/carol", tok).json()["role"] == "member"
    assert api(github, "/orgs/acme/teams/gpu/memberships/alice", tok).status_code == 404
    assert api(github, "/orgs/acme/teams/gpu/members/carol", tok).status_code == 204
    assert api(github, "/orgs/acme/teams/gpu/members/alice", tok).status_code == 404
    # a secret team is invisible to an organization member outside it...
    assert api(github, "/orgs/acme/teams/hidden/members/carol", tok).status_code == 404
    # ...but not to its members or the organization's owners
    assert api(github, "/orgs/acme/teams/hidden/members/carol", token(github, "carol")).ok
    assert api(github, "/orgs/acme/teams/hidden/members/carol", token(github, "alice")).ok


def test_user_orgs_and_unknown_paths(github):
    orgs = api(github, "/user/orgs", token(github, "bob")).json()
    assert [o["login"] for o in orgs] == ["acme"]
    assert api(github, "/user/orgs", token(github, "bob", scope="")).json() == []
    r = api(github, "/repos/acme/x", token(github, "bob"))
    assert r.status_code == 404 and r.json()["message"] == "Not Found"


def test_authorize_refusals():
    sim = GitHubSim(callback_url="http://127.0.0.1:9/hub/oauth_callback")
    sim.add_user("alice")
    with sim.in_thread():
        url = f"{sim.url}/login/oauth/authorize"
        unknown = requests.get(url, params={"client_id": "nope"}, timeout=5)
        assert unknown.status_code == 404 and "nope" in unknown.text
        elsewhere = requests.get(
            url,
            params={
                "client_id": sim.client_id,
                "redirect_uri": "http://evil.example/cb",
                "state": "s",
            },
            allow_redirects=False,
            timeout=5,
        )
        query = parse_qs(urlsplit(elsewhere.headers["Location"]).query)
        assert elsewhere.headers["Location"].startswith(CALLBACK)
        assert query["error"] == ["redirect_uri_mismatch"] and query["state"] == ["s"]
        denied = requests.get(
            url,
            params={"client_id": sim.client_id, "state": "s", "deny": "1"},
            allow_redirects=False,
            timeout=5,
        )
        assert parse_qs(urlsplit(denied.headers["Location"]).query)["error"] == ["access_denied"]


def test_declarations_are_checked():
    state = GitHubState()
    state.add_user("alice")
    with pytest.raises(SimError, match="already exists"):
        state.add_user("Alice")
    with pytest.raises(SimError, match="no user bob"):
        state.add_org("acme", members=["bob"])
    with pytest.raises(SimError, match="no organization"):
        state.add_team("nope", "t")


def test_command_line_serves_the_users_file(tmp_path):
    spec = {
        "users": [{"login": "alice", "name": "Alice"}, "bob"],
        "orgs": [
            {"login": "acme", "members": ["bob"], "teams": [{"slug": "t", "members": ["alice"]}]}
        ],
    }
    users = tmp_path / "users.yaml"
    users.write_text(yaml.safe_dump(spec))
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.github_sim", "--users", str(users), "--max-per-page", "5"],
        cwd=Path(__file__).resolve().parents[2],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        line = proc.stdout.readline()
        assert line.startswith("GitHub stand-in at http://127.0.0.1:"), line
        url = line.split()[3]
        page = requests.get(
            f"{url}/login/oauth/authorize",
            params={"client_id": "gputap-test-client", "redirect_uri": CALLBACK},
            timeout=5,
        )
        assert user_link(page.text, "alice") and user_link(page.text, "bob")
    finally:
        proc.terminate()
        proc.wait(10)
