"""`GPUTAP_DEMO_GITHUB=1 make demo`: GitHub login through the stand-in, labelled as one."""

import requests
from oauthenticator.github import GitHubOAuthenticator
from traitlets.config import Config

from gputap_common.settings import load_settings
from hub_config.hub import apply
from tests.github_sim.client import user_link
from tests.github_sim.demo import STAND_IN_NOTICE, stand_in_environment, start_github_stand_in


def test_demo_settings_make_a_labelled_github_login(tmp_path, monkeypatch):
    monkeypatch.delenv("JUPYTERHUB_CRYPT_KEY", raising=False)
    f = tmp_path / "g.yaml"
    f.write_text(f"data_dir: {tmp_path}\n")
    c = Config()
    apply(c, load_settings(f, environ=stand_in_environment("http://127.0.0.1:1234")))
    auth = GitHubOAuthenticator(config=c)
    assert auth.github_url == "http://127.0.0.1:1234"
    assert auth.login_service == "GitHub stand-in"  # the button: "Sign in with GitHub stand-in"
    assert auth.admin_groups == {"demo-uni:hub-admins"}
    assert auth.allow_all is True
    assert c.JupyterHub.template_vars["announcement_login"] == STAND_IN_NOTICE


def test_demo_stand_in_serves_the_demo_users(tmp_path):
    proc, url = start_github_stand_in("127.0.0.1", tmp_path / "stand-in.log")
    try:
        page = requests.get(
            f"{url}/login/oauth/authorize",
            # the demo hub's callback on loopback (the stand-in's registered one, any port)
            params={
                "client_id": "gputap-test-client",
                "redirect_uri": "http://127.0.0.1:9/hub/oauth_callback",
            },
            timeout=5,
        )
        for login in ("alice", "bob", "carol", "dave"):
            assert user_link(page.text, login)
    finally:
        proc.terminate()
        proc.wait(10)


def test_demo_stand_in_instructor_team_is_an_instructor_team(tmp_path, monkeypatch):
    """Bob maintains demo-uni:ml-staff, the team the demo users' file calls the instructors':
    the demo makes it an instructor team (on main it was only a label)."""
    monkeypatch.delenv("JUPYTERHUB_CRYPT_KEY", raising=False)
    f = tmp_path / "g.yaml"
    f.write_text(f"data_dir: {tmp_path}\n")
    c = Config()
    settings = load_settings(f, environ=stand_in_environment("http://127.0.0.1:1234"))
    apply(c, settings)
    assert settings.courses["instructor_teams"] == ["demo-uni:ml-staff"]
    roles = {role["name"]: role for role in c.JupyterHub.load_roles}
    assert roles["gputap-instructor"]["groups"] == ["demo-uni:ml-staff"]
    assert roles["gputap-billing-admin"]["groups"] == ["demo-uni:hub-admins"]
