"""GitHub login settings -> a GitHubOAuthenticator the real class accepts."""

import os
import re
import stat

import pytest
import yaml
from oauthenticator.github import GitHubOAuthenticator
from traitlets.config import Config

from gputap_common.settings import SettingsError, load_settings
from hub_config.github import ensure_crypt_key, github_settings, github_team_groups
from hub_config.github_auth import GPUTapGitHubOAuthenticator
from hub_config.hub import apply


def configure(tmp_path, github, courses=None, **hub):
    settings = {
        "data_dir": str(tmp_path / "data"),
        "hub": {"github": {"client_id": "id", "client_secret": "secret", **github}, **hub},
        "spawner": {"allow_shared_unix_user": True},
        "courses": courses or {},
    }
    f = tmp_path / "gputap.yaml"
    f.write_text(yaml.safe_dump(settings))
    c = Config()
    apply(c, load_settings(f, environ={}))
    return c


@pytest.fixture(autouse=True)
def no_crypt_key_in_environment(monkeypatch):
    monkeypatch.delenv("JUPYTERHUB_CRYPT_KEY", raising=False)


def team(org, slug):
    return {"slug": slug, "name": slug.title(), "organization": {"login": org}}


def test_teams_become_lower_case_org_team_groups():
    state = {"teams": [team("Acme", "gpu-users"), team("acme", "gpu-users"), team("b", "x")]}
    assert github_team_groups(state) == ["acme:gpu-users", "b:x"]
    assert github_team_groups({"teams": []}) == []
    assert github_team_groups({}) == []


def test_parent_teams_are_groups_too():
    state = {"teams": [team("acme", "ml-2026")], "gputap_parent_teams": [team("Acme", "staff")]}
    assert github_team_groups(state) == ["acme:ml-2026", "acme:staff"]


def test_any_github_user_may_sign_up_by_default(tmp_path):
    c = configure(tmp_path, {})
    assert c.JupyterHub.authenticator_class == "hub_config.github_auth.GPUTapGitHubOAuthenticator"
    auth = GPUTapGitHubOAuthenticator(config=c)
    assert isinstance(auth, GitHubOAuthenticator)
    assert auth.allow_all is True and not auth.allowed_organizations
    assert auth.refresh_grace_seconds == 3600 and auth.auth_refresh_age == 300
    assert auth.http_request_kwargs == {"request_timeout": 10.0, "connect_timeout": 10.0}
    assert auth.watched_organizations == set()
    assert auth.scope == ["read:org"]
    assert auth.populate_teams_in_auth_state and auth.enable_auth_state and auth.manage_groups
    assert auth.auth_state_groups_key is github_team_groups
    assert auth.github_api == "https://api.github.com"
    assert auth.login_service == "GitHub"
    assert "announcement_login" not in c.JupyterHub.get("template_vars", {})


def test_restrictions_admins_and_enterprise(tmp_path):
    c = configure(
        tmp_path,
        {
            "allowed_organizations": ["Acme", "uni:ml-course"],
            "admin_teams": ["acme:hub-admins"],
            "url": "https://github.example.org/",
            "callback_url": "https://gputap.example.org/hub/oauth_callback",
        },
        admin_users=["root-user"],
    )
    auth = GPUTapGitHubOAuthenticator(config=c)
    assert auth.watched_organizations == {"acme", "uni"}  # each setting's organizations
    assert auth.allow_all is False
    assert auth.allowed_organizations == {"acme", "uni:ml-course"}
    assert "acme, uni:ml-course" in auth.custom_403_message
    assert auth.admin_groups == {"acme:hub-admins"}
    assert auth.admin_users == {"root-user"}
    assert auth.github_url == "https://github.example.org"
    assert auth.github_api == "https://github.example.org/api/v3"
    assert auth.authorize_url == "https://github.example.org/login/oauth/authorize"
    assert auth.oauth_callback_url == "https://gputap.example.org/hub/oauth_callback"
    [billing_admins] = [r for r in c.JupyterHub.load_roles if r["name"] == "gputap-billing-admin"]
    assert billing_admins["users"] == ["root-user"]
    assert billing_admins["groups"] == ["acme:hub-admins"]


@pytest.mark.parametrize(
    "github,message",
    [
        ({"github_url": "https://ghe"}, "now hub.github.url"),
        ({"allowed_organisations": ["a"]}, "allowed_organisations is not a setting"),
        ({"client_secret": ""}, "client_secret must be set"),
        (
            {"allowed_organizations": ["acme/team"]},
            "allowed_organizations[0] must be an organization 'org' or a team 'org:team-slug', "
            "not 'acme/team'; use the team's slug as in its URL, "
            "github.com/orgs/acme/teams/team: acme:team",
        ),
        ({"admin_teams": ["acme"]}, "admin_teams[0] must be 'org:team-slug', not 'acme'"),
        (
            {"admin_teams": ["Acme:Hub Admins"]},
            "hub.github.admin_teams[0] must be 'org:team-slug', not 'Acme:Hub Admins'; use the "
            "team's slug as in its URL, github.com/orgs/acme/teams/hub-admins: acme:hub-admins",
        ),
        ({"url": "github.example.org"}, "must be an http"),
        ({"api_url": "api.example.org"}, "hub.github.api_url must be an http"),
        ({"callback_url": "gputap.example.org/hub/oauth_callback"}, "callback_url must be an http"),
        (
            {"url": "http://github.example.org"},
            "hub.github.url http://github.example.org is plain http: the OAuth app's client "
            "secret would travel unencrypted; use https:// (http:// only on a loopback "
            "address: 127.0.0.1, ::1, localhost)",
        ),
        ({"url": "http://127.0.0.1.example.org"}, "hub.github.url http://127.0.0.1.example.org"),
        ({"url": "http://localhost.example.org"}, "hub.github.url http://localhost.example.org"),
        (
            {"url": "https://github.example.org", "api_url": "http://api.example.org"},
            "hub.github.api_url http://api.example.org is plain http: users' GitHub tokens",
        ),
        (
            {"callback_url": "http://gputap.example.org/hub/oauth_callback"},
            "hub.github.callback_url http://gputap.example.org/hub/oauth_callback is plain http: "
            "the login's code",
        ),
    ],
)
def test_bad_github_settings_say_what_is_wrong(github, message):
    hub = {"github": {"client_id": "id", "client_secret": "secret", **github}}
    with pytest.raises(SettingsError, match=re.escape(message)):
        github_settings(hub)


def test_team_names_are_kept_as_the_hub_groups_are(tmp_path):
    c = configure(
        tmp_path,
        {
            "admin_teams": ["Acme:Hub-Admins"],
            "allowed_organizations": ["Initech", "Acme:GPU-Users"],
        },
        courses={"instructor_teams": ["Acme:ML-Staff", " acme:ml-staff", "Uni.EDU:dl_2026"]},
    )
    auth = GitHubOAuthenticator(config=c)
    assert auth.admin_groups == {"acme:hub-admins"}
    assert auth.allowed_organizations == {"initech", "acme:gpu-users"}
    roles = {r["name"]: r for r in c.JupyterHub.load_roles}
    assert roles["gputap-billing-admin"]["groups"] == ["acme:hub-admins"]
    assert roles["gputap-instructor"]["groups"] == ["acme:ml-staff", "uni.edu:dl_2026"]
    settings = load_settings(tmp_path / "gputap.yaml", environ={})
    assert settings.courses["instructor_teams"] == ["acme:ml-staff", "uni.edu:dl_2026"]
    assert settings.hub["github"]["admin_teams"] == ["acme:hub-admins"]


def test_a_display_name_for_an_instructor_team_is_refused_with_its_slug(tmp_path):
    fix = (
        "courses.instructor_teams[0] must be 'org:team-slug', not 'Acme:ML Staff'; use the "
        "team's slug as in its URL, github.com/orgs/acme/teams/ml-staff: acme:ml-staff"
    )
    f = tmp_path / "gputap.yaml"
    f.write_text("courses:\n  instructor_teams: ['Acme:ML Staff']\n")
    with pytest.raises(SettingsError, match=re.escape(fix)):
        load_settings(f, environ={})
    variable = {"GPUTAP__COURSES__INSTRUCTOR_TEAMS": "['Acme:ML Staff']"}
    with pytest.raises(SettingsError, match=re.escape(fix)):
        load_settings(environ=variable)


@pytest.mark.parametrize(
    "github,web,api",
    [
        ({}, "https://github.com", "https://api.github.com"),
        ({"url": "https://github.com/"}, "https://github.com", "https://api.github.com"),
        # GitHub Enterprise Cloud with data residency
        ({"url": "https://Octo.ghe.com"}, "https://Octo.ghe.com", "https://api.octo.ghe.com"),
        # GitHub Enterprise Server
        (
            {"url": "https://github.example.org/"},
            "https://github.example.org",
            "https://github.example.org/api/v3",
        ),
        (
            {"url": "https://github.example.org", "api_url": "https://api.example.org/v3/"},
            "https://github.example.org",
            "https://api.example.org/v3",
        ),
        # plain http on the machine itself (the stand-in)
        ({"url": "http://127.0.0.1:9000"}, "http://127.0.0.1:9000", "http://127.0.0.1:9000/api/v3"),
        (
            {
                "url": "http://localhost:9000",
                "api_url": "http://[::1]:9001",
                "callback_url": "http://127.8.0.1:8000/hub/oauth_callback",
            },
            "http://localhost:9000",
            "http://[::1]:9001",
        ),
    ],
)
def test_the_api_url_follows_the_web_url_unless_set(tmp_path, github, web, api):
    auth = GitHubOAuthenticator(config=configure(tmp_path, github))
    assert auth.github_url == web
    assert auth.github_api == api
    assert auth.userdata_url == f"{api}/user"
    assert auth.token_url == f"{web}/login/oauth/access_token"


def test_no_client_id_is_the_development_login(tmp_path):
    assert github_settings({"github": {"client_id": "", "allowed_organizations": []}}) is None
    c = Config()
    f = tmp_path / "g.yaml"
    f.write_text(f"data_dir: {tmp_path}\nhub:\n  login_notice: Welcome\n")
    apply(c, load_settings(f, environ={}))
    assert c.JupyterHub.authenticator_class == "hub_config.dev_login.DevLoginAuthenticator"
    notice = c.JupyterHub.template_vars["announcement_login"]
    assert notice.startswith("Development login: any username") and notice.endswith(" Welcome")


def test_crypt_key_is_made_once_private_and_kept(tmp_path):
    c = configure(tmp_path, {})
    key_file = tmp_path / "data" / "jupyterhub_crypt_key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    [key] = c.CryptKeeper["keys"]
    assert len(key) == 64 and key == key_file.read_text().strip()
    assert configure(tmp_path, {}).CryptKeeper["keys"] == [key]  # the same key after a restart


def test_crypt_key_from_the_environment_wins(tmp_path, monkeypatch):
    monkeypatch.setenv("JUPYTERHUB_CRYPT_KEY", "ab" * 32)
    c = configure(tmp_path, {})
    assert "keys" not in c.CryptKeeper
    assert not (tmp_path / "data" / "jupyterhub_crypt_key").exists()


def test_crypt_keys_the_hub_was_given_win(tmp_path):
    # z2jh's jupyterhub_config.py sets them from its Secret `hub` (made once, kept across
    # upgrades) before the chart's extraConfig configures gputap: a key file on the hub pod's
    # disk would be lost with the pod where no volume holds it (PostgreSQL), and users' GitHub
    # tokens with it
    settings = {
        "data_dir": str(tmp_path / "data"),
        "hub": {"github": {"client_id": "id", "client_secret": "secret"}},
        "spawner": {"allow_shared_unix_user": True},
    }
    f = tmp_path / "gputap.yaml"
    f.write_text(yaml.safe_dump(settings))
    c = Config()
    c.CryptKeeper.keys = ["cd" * 32]
    apply(c, load_settings(f, environ={}))
    assert c.CryptKeeper["keys"] == ["cd" * 32]
    assert not (tmp_path / "data" / "jupyterhub_crypt_key").exists()


def test_readable_or_broken_crypt_keys_are_refused(tmp_path):
    readable = tmp_path / "readable"
    readable.write_text("ab" * 32)
    os.chmod(readable, 0o644)
    with pytest.raises(SettingsError, match=f"chmod 600 {readable}"):
        ensure_crypt_key(readable)
    broken = tmp_path / "broken"
    broken.write_text("not a key")
    os.chmod(broken, 0o600)
    with pytest.raises(SettingsError, match="not a 32-byte hex key"):
        ensure_crypt_key(broken)
