"""`make demo` lets one person play every role: it names an admin and an instructor (with the
development login, where any name signs in) and prints who plays what."""

from traitlets.config import Config

from gputap_common.settings import load_settings
from hub_config import demo
from hub_config.hub import apply


def _settings(tmp_path, text="", environ=None):
    f = tmp_path / "s.yaml"
    f.write_text(f"data_dir: {tmp_path}\n{text}")
    return load_settings(f, environ=environ or {})


def test_dev_login_demo_names_an_admin_and_an_instructor(tmp_path, monkeypatch):
    monkeypatch.delenv("JUPYTERHUB_CRYPT_KEY", raising=False)
    environ = demo.role_environment(_settings(tmp_path))
    settings = _settings(tmp_path, environ=environ)
    assert settings.hub["admin_users"] == [demo.DEMO_ADMIN]
    assert settings.courses["instructors"] == [demo.DEMO_INSTRUCTOR]
    c = Config()
    apply(c, settings)
    roles = {role["name"]: role for role in c.JupyterHub.load_roles}
    assert roles["gputap-billing-admin"]["users"] == [demo.DEMO_ADMIN]
    assert roles["gputap-instructor"]["users"] == [demo.DEMO_INSTRUCTOR]
    assert c.Authenticator.admin_users == {demo.DEMO_ADMIN}


def test_demo_prints_who_plays_each_role(tmp_path):
    settings = _settings(tmp_path, environ=demo.role_environment(_settings(tmp_path)))
    text = demo.roles_text(settings)
    assert f"admin: sign in as {demo.DEMO_ADMIN}" in text
    assert f"instructor: sign in as {demo.DEMO_INSTRUCTOR}" in text
    assert "student: anyone else who signs in" in text


def test_demo_keeps_the_operators_own_roles(tmp_path):
    """Roles the settings already name are the operator's: the demo adds none of its own."""
    settings = _settings(tmp_path, "hub:\n  admin_users: [root]\ncourses:\n  instructors: [ta]\n")
    assert demo.role_environment(settings) == {}
    text = demo.roles_text(settings)
    assert "admin: sign in as root" in text and "instructor: sign in as ta" in text


def test_github_demo_roles_are_teams(tmp_path):
    """With GitHub login nobody is made admin by name: the roles are the configured teams."""
    settings = _settings(
        tmp_path,
        "hub:\n  github:\n    client_id: x\n    client_secret: y\n"
        "    admin_teams: [uni:admins]\ncourses:\n  instructor_teams: [uni:staff]\n",
    )
    assert demo.role_environment(settings) == {}
    text = demo.roles_text(settings)
    assert "admin: a member of uni:admins" in text
    assert "instructor: a member of uni:staff" in text
