"""Where the hub listens for servers' pods, and what the servers are told (docs/kubernetes.md,
"How servers reach the hub"): one machine's hub_config.hub, and the chart's hub_config.z2jh."""

import pytest
from traitlets.config import Config

from gputap_common.settings import SettingsError, load_settings
from hub_config.hub import apply
from hub_config.z2jh import configure


def one_machine(tmp_path, **kube):
    environ = {"GPUTAP__DATA_DIR": str(tmp_path), "GPUTAP__SPAWNER__BACKEND": "kubernetes"}
    environ.update({f"GPUTAP__SPAWNER__KUBERNETES__{k.upper()}": v for k, v in kube.items()})
    c = Config()
    apply(c, load_settings(environ=environ))
    return c


def test_the_hub_listens_at_the_address_pods_reach_and_servers_are_told_it(tmp_path):
    c = one_machine(tmp_path, hub_ip="10.42.0.1")
    assert c.JupyterHub.hub_ip == "10.42.0.1"
    # JupyterHub then tells servers http://10.42.0.1:HUB_PORT/hub/api
    assert "hub_connect_url" not in c.JupyterHub


def test_every_address_needs_the_url_pods_dial(tmp_path):
    with pytest.raises(SettingsError, match="set spawner.kubernetes.hub_connect_url too"):
        one_machine(tmp_path, hub_ip="0.0.0.0")
    c = one_machine(tmp_path, hub_ip="0.0.0.0", hub_connect_url="http://10.42.0.1:8081")
    assert (c.JupyterHub.hub_ip, c.JupyterHub.hub_connect_url) == (
        "0.0.0.0",
        "http://10.42.0.1:8081",
    )


@pytest.mark.parametrize(
    "hub_ip, says",
    [
        ("", "spawner.kubernetes.hub_ip is empty: servers' pods have their own network"),
        ("127.0.0.1", "spawner.kubernetes.hub_ip 127.0.0.1 is a loopback address"),
        ("::1", "spawner.kubernetes.hub_ip ::1 is a loopback address"),
        ("localhost", "spawner.kubernetes.hub_ip 'localhost' is not an IP address"),
    ],
)
def test_a_hub_pods_cannot_reach_is_refused_saying_what_to_set(tmp_path, hub_ip, says):
    with pytest.raises(SettingsError) as refused:
        one_machine(tmp_path, hub_ip=hub_ip)
    assert str(refused.value).startswith(says)
    assert "the node's InternalIP" in str(refused.value)


def z2jh_config() -> Config:
    """c as z2jh's jupyterhub_config.py leaves it (chart 4.x, files/hub/jupyterhub_config.py:
    ``hub_bind_url = "http://:8081"``, ``hub_connect_url = "http://hub:8081"`` from the hub
    Service's name and port) before gputap's extraConfig runs."""
    c = Config()
    c.JupyterHub.hub_bind_url = "http://:8081"
    c.JupyterHub.hub_connect_url = "http://hub:8081"
    c.JupyterHub.services = [{"name": "billing", "api_token": "z2jh"}]
    return c


ENVIRON = {"HELM_RELEASE_NAME": "gputap", "POD_NAMESPACE": "gputap"}


def test_under_the_chart_the_hub_stays_where_z2jh_binds_it_and_pods_use_its_service():
    c = z2jh_config()
    configure(c, {"spawner": {"backend": "kubernetes"}}, environ=ENVIRON)
    assert c.JupyterHub.hub_bind_url == "http://:8081"  # every address of the hub pod
    assert c.JupyterHub.hub_connect_url == "http://hub:8081"
    assert "hub_ip" not in c.JupyterHub


def test_under_the_chart_hub_ip_is_refused():
    gputap = {"spawner": {"backend": "kubernetes", "kubernetes": {"hub_ip": "10.42.0.1"}}}
    with pytest.raises(SettingsError, match="hub_ip is for a hub on a machine of its own"):
        configure(z2jh_config(), gputap, environ=ENVIRON)
