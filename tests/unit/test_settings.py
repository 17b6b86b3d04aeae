import os

import pytest

from gputap_common.settings import SettingsError, load_settings

#: the Kubernetes backend starts only with an address its pods reach (docs/kubernetes.md)
KUBE_HUB_IP = {"GPUTAP__SPAWNER__KUBERNETES__HUB_IP": "10.42.0.1"}


def test_defaults_file_and_environment_in_order(tmp_path):
    f = tmp_path / "gputap.yaml"
    f.write_text("data_dir: state\nbilling:\n  trial_credit: '5.00'\n  port: 9000\n")
    s = load_settings(f, environ={"GPUTAP__BILLING__PORT": "9100", "GPUTAP__HUB__PORT": "8100"})
    assert s.data_dir == tmp_path / "state"
    assert s.billing["trial_credit"] == "5.00"
    assert s.billing["port"] == 9100 and s.hub["port"] == 8100
    assert s.billing["database_url"] == f"sqlite:///{tmp_path / 'state'}/billing.sqlite"
    assert s.billing["prices"]["RTX-4090"] == "5.00"  # defaults survive a partial file


def test_settings_file_named_by_environment(tmp_path):
    f = tmp_path / "g.yaml"
    f.write_text("hub:\n  port: 8222\n")
    assert load_settings(environ={"GPUTAP_SETTINGS": str(f)}).hub["port"] == 8222


@pytest.mark.parametrize("text,message", [("- a\n- b\n", "mapping"), ("a: [\n", "not valid YAML")])
def test_bad_files_say_why(tmp_path, text, message):
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    with pytest.raises(SettingsError, match=message):
        load_settings(f, environ={})


def test_missing_file_is_named(tmp_path):
    with pytest.raises(SettingsError, match="does not exist"):
        load_settings(tmp_path / "nope.yaml", environ={})


def test_environment_keys_match_existing_keys_whatever_their_case(tmp_path):
    # a key the schema does not declare (GPUTAP__HUB__NEW_KEY) is refused now
    # (test_settings_refusals.py); new keys of a free-form map keep the case they are written in
    s = load_settings(
        environ={"GPUTAP__BILLING__PRICES__T4": "1.25", "GPUTAP__BILLING__PRICES__B200": "20"}
    )
    assert s.billing["prices"]["T4"] == 1.25
    assert "t4" not in s.billing["prices"]
    assert s.billing["prices"]["B200"] == 20


def test_github_login_on_one_machine_needs_separate_unix_users(tmp_path):
    from traitlets.config import Config

    from hub_config.hub import apply

    f = tmp_path / "g.yaml"
    f.write_text(
        f"data_dir: {tmp_path}\nhub:\n  github:\n    client_id: abc\n    client_secret: s\n"
    )
    shared = {"GPUTAP__SPAWNER__SERVER_USER": "hub"}
    with pytest.raises(SettingsError, match="server_user: auto or per_user.*run_as_system_user"):
        apply(Config(), load_settings(f, environ=shared))
    c = Config()
    # the default: a Unix account per user where the hub is root, its own user otherwise
    if os.geteuid() == 0:
        apply(c, load_settings(f, environ={}))
        assert c.GPULocalSpawner.server_user == "auto"
    else:
        with pytest.raises(SettingsError, match="server_user: auto or per_user"):
            apply(Config(), load_settings(f, environ={}))
    c = Config()
    apply(c, load_settings(f, environ={"GPUTAP__SPAWNER__RUN_AS_SYSTEM_USER": "true"}))
    assert c.JupyterHub.authenticator_class == "hub_config.github_auth.GPUTapGitHubOAuthenticator"
    assert c.GPULocalSpawner.run_as_system_user is True


@pytest.mark.parametrize("backend", ["kubernetes", "local"])
def test_billing_gets_the_hubs_kubeconfig_to_meter_pods(tmp_path, monkeypatch, backend):
    from traitlets.config import Config

    from hub_config.hub import apply

    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "kubeconfig"))
    c = Config()
    environ = {"GPUTAP__SPAWNER__BACKEND": backend, **KUBE_HUB_IP}
    apply(c, load_settings(environ=environ))
    [billing] = [s for s in c.JupyterHub.services if s["name"] == "billing"]
    if backend == "kubernetes":
        assert billing["environment"]["KUBECONFIG"] == str(tmp_path / "kubeconfig")
    else:
        assert "KUBECONFIG" not in billing["environment"]


@pytest.mark.parametrize("backend", ["kubernetes", "local"])
def test_idle_culler_runs_as_a_service_and_servers_report_activity_in_time(tmp_path, backend):
    from traitlets.config import Config

    from hub_config.hub import apply

    c = Config()
    environ = {
        "GPUTAP__SPAWNER__BACKEND": backend,
        "GPUTAP__IDLE__TIMEOUT_SECONDS": "600",
        "GPUTAP__IDLE__ACTIVITY_INTERVAL_SECONDS": "20",
        **KUBE_HUB_IP,
    }
    apply(c, load_settings(environ=environ))
    [culler] = [s for s in c.JupyterHub.services if s["name"] == "idle-culler"]
    assert "--timeout=600" in culler["command"]
    [role] = [r for r in c.JupyterHub.load_roles if r["name"] == "idle-culler"]
    assert set(role["scopes"]) == {
        "list:users",
        "read:users:activity",
        "read:servers",
        "delete:servers",
    }
    spawner = c.KubeSpawner if backend == "kubernetes" else c.Spawner
    assert spawner.environment["JUPYTERHUB_ACTIVITY_INTERVAL"] == "20"


def test_idle_culler_can_be_off_and_bad_numbers_are_named(tmp_path):
    from traitlets.config import Config

    from hub_config.hub import apply

    c = Config()
    apply(c, load_settings(environ={"GPUTAP__IDLE__ENABLED": "false"}))
    assert not [s for s in c.JupyterHub.services if s["name"] == "idle-culler"]
    with pytest.raises(SettingsError, match="idle.timeout_seconds must be a whole number"):
        apply(Config(), load_settings(environ={"GPUTAP__IDLE__TIMEOUT_SECONDS": "soon"}))


def test_operator_environment_reaches_local_servers_before_gputaps_config(tmp_path):
    from traitlets.config import Config

    from hub_config.hub import apply

    c = Config()
    environ = {
        "GPUTAP__SPAWNER__ENVIRONMENT": "{JUPYTER_CONFIG_PATH: /etc/site, HF_HOME: /data/hf}",
    }
    apply(c, load_settings(environ=environ))
    assert c.Spawner.environment["HF_HOME"] == "/data/hf"
    first, ours = c.Spawner.environment["JUPYTER_CONFIG_PATH"].split(":")
    assert first == "/etc/site" and ours.endswith("hub_config/singleuser")
