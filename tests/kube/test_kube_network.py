"""Servers reach the hub over the pod network, as on a real cluster: each pod of the simulated
cluster has its own network namespace, so the hub's loopback is out of their reach."""

import ipaddress
from urllib.parse import urlparse

from tests.kube.test_kube_spawn import pod_of, reach


def test_a_server_reaches_the_hub_at_an_address_of_the_pod_network(platform, cluster):
    platform.create_user("nell")
    r = platform.spawn("nell", {"kind": "card", "card": "L40S", "count": 1})
    assert r.status_code in (201, 202), r.text
    platform.wait_ready("nell")
    env = {
        e["name"]: e.get("value") for e in pod_of(cluster, "nell")["spec"]["containers"][0]["env"]
    }
    api = urlparse(env["JUPYTERHUB_API_URL"])
    assert not ipaddress.ip_address(api.hostname).is_loopback, env["JUPYTERHUB_API_URL"]
    assert api.hostname == cluster.host_ip
    # a token is checked by the server asking the hub (server -> hub)
    reach(platform, "nell")
    # Lab in a browser: the server trades the OAuth code for a token at the hub
    browser = platform.login("nell")
    lab = browser.get(f"{platform.url}/user/nell/lab", timeout=60)
    assert lab.status_code == 200, platform.log_tail()
    assert urlparse(lab.url).path == "/user/nell/lab"
    platform.stop_server("nell")
