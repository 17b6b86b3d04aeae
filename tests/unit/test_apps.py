"""The ``apps`` settings (docs/lab.md, "Apps"): TensorBoard and the operator's apps, refused at
start-up naming the key when wrong, handed to each server for jupyter-server-proxy, and
registered by the server's own config file as Jupyter loads it."""

import json

import pytest
import yaml
from traitlets.config import Config, PyFileConfigLoader

from gputap_common.settings import SettingsError, load_settings
from hub_config.hub import ROOT, apply
from spawner.core.apps import check_apps, proxy_servers
from spawner.core.record import ServerRecord
from spawner.lifecycle.server_apps import apps_env
from tests.doubles.billing import BillingDouble
from tests.doubles.spawner import simulated_machine, spawner_double

SINGLEUSER = ROOT / "hub_config" / "singleuser"

TENSORBOARD = {
    "command": [
        "tensorboard",
        "--logdir",
        "~/runs",
        "--port",
        "{port}",
        "--host",
        "127.0.0.1",
    ],
    "timeout": 60.0,
    "absolute_url": False,
    "update_last_activity": False,
    "launcher_entry": {"enabled": True, "title": "TensorBoard", "icon_path": "tensorboard.svg"},
}


#: environments beside gputap's own (the hub's Python on one machine)
#: what the backend spawner class's own get_env hands every server
BASE_ENV = {"PATH": "/usr/bin"}
ENVIRONMENTS = {key: {"name": key} for key in ("pytorch", "tensorflow", "vllm")}


def settings(tmp_path, apps=None, environments=None, **environ):
    f = tmp_path / "gputap.yaml"
    values = {"data_dir": str(tmp_path), "apps": apps or {}, "environments": environments or {}}
    f.write_text(yaml.safe_dump(values))
    return load_settings(f, environ=environ)


def started(tmp_path, apps=None, environments=None, **environ) -> Config:
    """The hub's config as jupyterhub_config.py makes it (what start-up checks)."""
    c = Config()
    apply(c, settings(tmp_path, apps, environments, **environ))
    return c


def refusal(tmp_path, apps, **environ) -> str:
    with pytest.raises(SettingsError) as refused:
        started(tmp_path, apps, **environ)
    return str(refused.value)


def test_every_server_has_tensorboard_on_its_runs_folder_by_default(tmp_path):
    c = started(tmp_path)
    assert proxy_servers(c.GPUSpawnerMixin.apps) == {"tensorboard": TENSORBOARD}


def test_an_operator_app_becomes_a_proxy_server_with_its_launcher_tile(tmp_path):
    apps = {
        "custom": {
            "viewer": {
                "title": "Viewer",
                "command": ["my-viewer", "--port", "{port}", "--root", "~/data"],
                "icon": "/opt/viewer/icon.svg",
            },
            "metrics-ui": {
                "port": 9400,
                "launcher": False,
                "timeout_seconds": 5,
                "activity": False,
            },
        }
    }
    servers = proxy_servers(started(tmp_path, apps).GPUSpawnerMixin.apps)
    assert servers == {
        "tensorboard": TENSORBOARD,
        "viewer": {
            "command": ["my-viewer", "--port", "{port}", "--root", "~/data"],
            "timeout": 30.0,
            "absolute_url": False,
            "update_last_activity": True,
            "launcher_entry": {
                "enabled": True,
                "title": "Viewer",
                "icon_path": "/opt/viewer/icon.svg",
            },
        },
        # something already listens there: nothing to start, no tile
        "metrics-ui": {
            "command": [],
            "timeout": 5.0,
            "absolute_url": False,
            "update_last_activity": False,
            "launcher_entry": {"enabled": False, "title": "metrics-ui"},
            "port": 9400,
        },
    }


def test_tensorboard_follows_its_settings_and_can_be_turned_off(tmp_path):
    apps = {"tensorboard": {"log_dir": "/scratch/runs", "launcher": False}}
    [tensorboard] = proxy_servers(started(tmp_path, apps).GPUSpawnerMixin.apps).values()
    assert tensorboard["command"][:3] == ["tensorboard", "--logdir", "/scratch/runs"]
    assert tensorboard["launcher_entry"]["enabled"] is False
    c = started(tmp_path, GPUTAP__APPS__TENSORBOARD__ENABLED="false")
    assert proxy_servers(c.GPUSpawnerMixin.apps) == {}


def test_apps_go_only_to_servers_of_their_environments(tmp_path):
    apps = {
        "tensorboard": {"environments": ["pytorch", "tensorflow"]},
        "custom": {"lab-ui": {"port": 7000}, "vllm-ui": {"port": 7001, "environments": ["vllm"]}},
    }
    loaded = started(tmp_path, apps, ENVIRONMENTS).GPUSpawnerMixin.apps
    assert set(proxy_servers(loaded, "pytorch")) == {"tensorboard", "lab-ui"}
    assert set(proxy_servers(loaded, "vllm")) == {"lab-ui", "vllm-ui"}
    # the backend's default environment: only what every environment has
    assert set(proxy_servers(loaded, "")) == {"lab-ui"}


# -- refused at start-up, naming the key ------------------------------------------------------


@pytest.mark.parametrize(
    "apps, message",
    [
        (
            {"custom": {"viewer": {"comand": ["v", "{port}"]}}},
            "apps.custom.viewer.comand is not a setting; did you mean apps.custom.viewer.command?",
        ),
        (
            {"tensorbord": {"enabled": False}},
            "apps.tensorbord is not a setting; did you mean apps.tensorboard?",
        ),
        (
            {"custom": {"viewer": {"port": 0}}},
            "apps.custom.viewer.port must be a port from 1 to 65535, or null (a free port is "
            "chosen), not 0",
        ),
        (
            {"custom": {"My Viewer": {"port": 7000}}},
            "apps.custom: 'My Viewer' must be an app name of lower-case letters, digits, '-' and "
            "'_' (it is the app's URL path)",
        ),
        (
            {"custom": {"viewer": {"port": 7000, "icon": "viewer.png"}}},
            "apps.custom.viewer.icon must be an SVG file's path (ending .svg), or empty, "
            "not 'viewer.png'",
        ),
        (
            {"custom": {"viewer": {"command": "my-viewer --port {port}"}}},
            "apps.custom.viewer.command must be a list of non-empty strings, "
            "not 'my-viewer --port {port}'",
        ),
        (
            {"custom": {"viewer": {"port": 7000, "environments": "all"}}},
            "apps.custom.viewer.environments must be a list, each item an environment's key, "
            "or all, not 'all'",
        ),
    ],
)
def test_a_malformed_app_is_refused_naming_its_key(tmp_path, apps, message):
    assert refusal(tmp_path, apps).endswith(message)


@pytest.mark.parametrize(
    "apps, message",
    [
        (
            {"custom": {"viewer": {"command": ["my-viewer", "--port", "8080"]}}},
            "apps.custom.viewer.command never names {port}, and port is null",
        ),
        ({"custom": {"viewer": {"title": "Viewer"}}}, "apps.custom.viewer needs a command"),
        ({"custom": {"lab": {"port": 7000}}}, "apps.custom.lab: 'lab' is a path the server"),
        ({"custom": {"proxy": {"port": 7000}}}, "apps.custom.proxy: 'proxy' is a path"),
        (
            {"custom": {"tensorboard": {"port": 6006}}},
            "apps.custom.tensorboard is the built-in TensorBoard's name",
        ),
        (
            {"custom": {"viewer": {"port": 7000, "environments": ["all", "pytorch"]}}},
            "apps.custom.viewer.environments: all already means every environment",
        ),
        ({"tensorboard": {"environments": []}}, "apps.tensorboard.environments is empty"),
    ],
)
def test_an_app_that_could_not_work_stops_the_hub_naming_its_key(tmp_path, apps, message):
    assert message in refusal(tmp_path, apps)


def test_the_operator_may_replace_the_built_in_tensorboard(tmp_path):
    apps = {"tensorboard": {"enabled": False}, "custom": {"tensorboard": {"port": 6006}}}
    assert proxy_servers(started(tmp_path, apps).GPUSpawnerMixin.apps)["tensorboard"]["port"] == (
        6006
    )


def test_environments_named_must_exist_when_they_are_known(tmp_path):
    apps = settings(tmp_path, {"custom": {"ui": {"port": 7000, "environments": ["pytorch"]}}})
    check_apps(apps.section("apps"), {"pytorch", "minimal"})
    with pytest.raises(SettingsError, match="apps.custom.ui.environments: pytorch is no env"):
        check_apps(apps.section("apps"), {"minimal"})


# -- the server side: what hub_config/singleuser/jupyter_server_config.py registers ---------


def server_proxy_config(monkeypatch, tmp_path, handed: dict) -> dict:
    """c.ServerProxy.servers as Jupyter's config loader makes it from the server's config
    file, with ``handed`` as $GPUTAP_APPS."""
    monkeypatch.setenv("GPUTAP_APPS", json.dumps(handed))
    monkeypatch.setenv("HOME", str(tmp_path))
    loader = PyFileConfigLoader("jupyter_server_config.py", path=str(SINGLEUSER))
    return loader.load_config().ServerProxy.servers


def test_a_server_registers_the_apps_it_is_handed_with_their_icons(monkeypatch, tmp_path):
    apps = settings(tmp_path, {"custom": {"viewer": {"command": ["v", "{port}", "~/data"]}}})
    servers = server_proxy_config(monkeypatch, tmp_path, proxy_servers(apps.section("apps")))
    assert servers["tensorboard"]["command"][2] == f"{tmp_path}/runs"
    icon = servers["tensorboard"]["launcher_entry"]["icon_path"]
    assert icon == str(SINGLEUSER / "icons" / "tensorboard.svg")
    assert "<svg" in (SINGLEUSER / "icons" / "tensorboard.svg").read_text()
    assert servers["viewer"]["command"] == ["v", "{port}", f"{tmp_path}/data"]
    assert "icon_path" not in servers["viewer"]["launcher_entry"]


def test_a_server_handed_no_apps_registers_none(monkeypatch, tmp_path):
    monkeypatch.delenv("GPUTAP_APPS", raising=False)
    loader = PyFileConfigLoader("jupyter_server_config.py", path=str(SINGLEUSER))
    assert loader.load_config().ServerProxy.servers == {}


def test_a_spawner_hands_its_server_the_apps_of_its_environment(tmp_path):
    apps = {"custom": {"vllm-ui": {"port": 7001, "environments": ["vllm"]}}}
    config = started(tmp_path, apps, ENVIRONMENTS)
    # the in-process spawner double: GPUSpawnerMixin.get_env on JupyterHub's Spawner's
    machine, billing = simulated_machine(), BillingDouble()
    spawner = spawner_double(
        "ada", machine, billing, tmp_path, config=config, env_keep=[], environment=BASE_ENV
    )
    env = spawner.get_env()
    assert env["PATH"] == "/usr/bin" and set(json.loads(env["GPUTAP_APPS"])) == {"tensorboard"}
    spawner.record = ServerRecord(session_id="s1", offering="cpu", count=1, environment="vllm")
    assert set(json.loads(spawner.get_env()["GPUTAP_APPS"])) == {"tensorboard", "vllm-ui"}
    # the same, as the mixin's collaborator computes it from the settings alone
    loaded = config.GPUSpawnerMixin.apps
    assert set(json.loads(apps_env(loaded, "")["GPUTAP_APPS"])) == {"tensorboard"}
    handed = apps_env(loaded, "vllm")["GPUTAP_APPS"]
    assert set(json.loads(handed)) == {"tensorboard", "vllm-ui"}


def test_an_app_for_an_environment_the_hub_does_not_have_stops_it(tmp_path):
    apps = {"custom": {"ui": {"port": 7000, "environments": ["pytorch"]}}}
    assert "apps.custom.ui.environments: pytorch is no env" in refusal(tmp_path, apps)
