"""Servers on origins of their own (hub_config/origins.py): which subdomain_host the settings
give, GitHub login refused under one shared origin, the subdomain hook."""

import pytest
import yaml
from traitlets.config import Config

from gputap_common.settings import SettingsError, load_settings
from hub_config.hub import apply
from hub_config.origins import (
    checked_host,
    subdomain_host,
    users_apart_services_home,
)


def hub(**values):
    return {"subdomain_host": "auto", "ip": "127.0.0.1", "port": 8000, **values}


@pytest.mark.parametrize("ip", ["127.0.0.1", "::1", "localhost", "127.0.0.2"])
def test_auto_on_a_loopback_hub_is_localhost_at_the_proxys_port(ip):
    assert subdomain_host(hub(ip=ip, port=8123)) == "http://localhost:8123"


@pytest.mark.parametrize("ip", ["0.0.0.0", "", "10.1.2.3", "gpu.lab.example.org"])
def test_auto_on_a_reachable_hub_names_no_host_of_its_own(ip):
    assert subdomain_host(hub(ip=ip)) == ""


def test_auto_on_the_chart_is_the_charts_own_host_and_never_localhost():
    assert subdomain_host(hub(), on_chart=True) == ""
    assert (
        subdomain_host(hub(), "https://gpu.example.org", on_chart=True) == "https://gpu.example.org"
    )


def test_a_named_host_is_kept_and_empty_is_none():
    assert subdomain_host(hub(subdomain_host="https://gpu.example.org/")) == (
        "https://gpu.example.org"
    )
    assert subdomain_host(hub(subdomain_host="")) == ""


@pytest.mark.parametrize(
    "value",
    [
        "gpu.example.org",
        "ftp://gpu.example.org",
        "https://gpu.example.org/hub/",
        "https://gpu.example.org?x=1",
        "https://user@gpu.example.org",
        "https://",
    ],
)
def test_a_host_that_is_not_scheme_and_host_is_refused_saying_what_to_write(value):
    with pytest.raises(SettingsError, match="https://gputap.example.org"):
        checked_host(value)


def test_users_get_subdomains_services_stay_on_the_hubs_host():
    assert users_apart_services_home("alice", "localhost", "user") == "alice.localhost"
    assert users_apart_services_home("billing", "localhost", "service") == "localhost"
    # JupyterHub's own rule for a name that is no DNS label
    assert users_apart_services_home("a_b", "x.org", "user").endswith(".x.org")
    assert "_" not in users_apart_services_home("a_b", "x.org", "user")


def configure(tmp_path, **hub_settings):
    settings = {
        "data_dir": str(tmp_path / "data"),
        "hub": {"github": {"client_id": "id", "client_secret": "secret"}, **hub_settings},
        "spawner": {"allow_shared_unix_user": True},
    }
    f = tmp_path / "gputap.yaml"
    f.write_text(yaml.safe_dump(settings))
    c = Config()
    apply(c, load_settings(f, environ={}))
    return c


def test_github_login_under_one_origin_is_refused_naming_both_ways_out(tmp_path):
    with pytest.raises(SettingsError) as refused:
        configure(tmp_path, subdomain_host="")
    assert "hub.subdomain_host" in str(refused.value)
    assert "hub.all_users_trusted: true" in str(refused.value)
    with pytest.raises(SettingsError):
        configure(tmp_path, ip="0.0.0.0")  # auto finds no host to use


def test_github_login_with_subdomains_or_trusted_users_starts(tmp_path):
    c = configure(tmp_path)
    assert c.JupyterHub.subdomain_host == "http://localhost:8000"
    assert c.JupyterHub.subdomain_hook is users_apart_services_home
    c = configure(tmp_path, subdomain_host="", all_users_trusted=True)
    assert "subdomain_host" not in c.JupyterHub


def test_the_development_login_on_a_loopback_hub_gets_subdomains_too(tmp_path):
    f = tmp_path / "gputap.yaml"
    f.write_text(yaml.safe_dump({"data_dir": str(tmp_path / "data")}))
    c = Config()
    apply(c, load_settings(f, environ={}))
    assert c.JupyterHub.subdomain_host == "http://localhost:8000"
