"""GitHub login settings -> a GitHubOAuthenticator the real class accepts."""

import os
import stat

import pytest
import yaml
from oauthenticator.github import GitHubOAuthenticator
from traitlets.config import Config

from gputap_common.settings import SettingsError, load_settings
from hub_config.github import ensure_crypt_key, github_settings, github_team_groups
from hub_config.github_auth import GPUTapGitHubOAuthenticator
from hub_config.hub import apply


def configure(tmp_path, github, **hub):
    settings = {
        "data_dir": str(tmp_path / "data"),
        "hub": {"github": {"client_id": "id", "client_secret": "secret", **github}, **hub},
        "spawner": {"allow_shared_unix_user": True},
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
        ({"allowed_organizations": ["acme/team"]}, "'acme/team' is not an organization"),
        ({"admin_teams": ["acme"]}, "'acme' is not a team as org:team-slug"),
        ({"url": "github.example.org"}, "must be an http"),
    ],
)
def test_bad_github_settings_say_what_is_wrong(github, message):
    hub = {"github": {"client_id": "id", "client_secret": "secret", **github}}
    with pytest.raises(SettingsError, match=message):
        github_settings(hub)


def test_no_client_id_is_the_development_login(tmp_path):
    assert github_settings({"github": {"client_id": "", "allowed_organizations": []}}) is None
    c = Config()
    f = tmp_path / "g.yaml"
    f.write_text(f"data_dir: {tmp_path}\nhub:\n  login_notice: Welcome\n")
    apply(c, load_settings(f, environ={}))
    assert c.JupyterHub.authenticator_class == "dummy"
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
