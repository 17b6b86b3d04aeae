"""GPUKubeSpawner end to end: the real hub and proxy, the simulated cluster."""

import json

import requests

from tests.kube.conftest import kube_api


def pod_of(cluster, user):
    pods = [
        p
        for p in cluster.pods("gputap")
        if p["metadata"].get("labels", {}).get("hub.jupyter.org/username") == user
        and "deletionTimestamp" not in p["metadata"]
    ]
    assert len(pods) == 1, [p["metadata"]["name"] for p in pods]
    return pods[0]


def reach(platform, user, timeout=60):
    token = platform.user_token(user)

    def answers() -> bool:
        r = requests.get(
            f"{platform.url}/user/{user}/api/status",
            headers={"Authorization": f"token {token}"},
            timeout=5,
        )
        return r.status_code == 200

    platform.wait_for(answers, f"{user}'s server reachable", timeout, step=0.2)


def test_two_a100s_land_on_the_a100_node_with_the_right_pod(platform, cluster):
    platform.create_user("ada")
    r = platform.spawn("ada", {"kind": "card", "card": "A100-80GB", "count": 2})
    assert r.status_code in (201, 202), r.text
    platform.wait_ready("ada")
    reach(platform, "ada")
    pod = pod_of(cluster, "ada")
    spec, labels = pod["spec"], pod["metadata"]["labels"]
    assert spec["nodeName"] == "gpu-a100"
    container = spec["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert spec["nodeSelector"] == {
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
        "kubernetes.io/hostname": "gpu-a100",  # where its GPUs were reserved
    }
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec[
        "tolerations"
    ]
    assert spec["priorityClassName"] == "gputap-on-demand"
    assert labels["gputap.io/card"] == "A100-80GB" and labels["gputap.io/count"] == "2"
    assert labels["gputap.io/user"] == "ada" and labels["gputap.io/price-class"] == "on-demand"
    assert pod["metadata"]["annotations"]["gputap.io/offering"] == "A100-80GB"
    # the home volume is the user's own claim, kept across servers
    claims = [v["persistentVolumeClaim"]["claimName"] for v in spec["volumes"] if
              "persistentVolumeClaim" in v]  # fmt: skip
    assert claims == ["home-ada"]
    [session] = platform.account("ada")["running"]
    assert session["sku"] == "A100-80GB" and session["count"] == 2
    # billing's pod meter records the spawner's session, not a second one (one running, above)
    assert pod["metadata"]["annotations"]["gputap.io/session"] == session["id"]
    platform.stop_server("ada")
    [ended] = platform.sessions("ada")
    assert ended["state"] == "ended"
    assert kube_api(cluster).read_namespaced_persistent_volume_claim("home-ada", "gputap")


def started_pod(platform, cluster, user: str, options: dict) -> dict:
    """A new user's server started with ``options``, ready: its pod."""
    platform.create_user(user)
    r = platform.spawn(user, options)
    assert r.status_code in (201, 202), r.text
    platform.wait_ready(user)
    return pod_of(cluster, user)


def test_a_slice_lands_on_the_mig_node(platform, cluster):
    slice_ = {"kind": "slice", "card": "H100-80GB", "profile": "1g.10gb"}
    pod = started_pod(platform, cluster, "bea", slice_)
    assert pod["spec"]["nodeName"] == "gpu-h100"
    limits = pod["spec"]["containers"][0]["resources"]["limits"]
    assert limits["nvidia.com/mig-1g.10gb"] == "1" and "nvidia.com/gpu" not in limits
    assert pod["metadata"]["labels"]["gputap.io/slice"] == "1g.10gb"
    platform.stop_server("bea")


def test_a_spec_request_gets_the_cheapest_fit(platform, cluster):
    platform.create_user("cai")
    # >= 40 GB and >= 300 TFLOPS: L40S (6.00/h) beats A100-80GB (8.00/h); no slice is that big
    r = platform.spawn("cai", {"kind": "spec", "min_memory_gb": 40, "min_tflops": 300})
    assert r.status_code in (201, 202), r.text
    platform.wait_ready("cai")
    pod = pod_of(cluster, "cai")
    assert pod["spec"]["nodeName"] == "gpu-l40s"
    assert pod["metadata"]["labels"]["gputap.io/card"] == "L40S"
    platform.stop_server("cai")


def test_a_shared_gpu_is_a_cheaper_option_of_its_own(platform, cluster):
    platform.create_user("gus")
    from tests.integration.test_form import row

    page = platform.login("gus").get(f"{platform.url}/hub/spawn", timeout=30).content.decode()
    shared = row(page, "T4/shared")
    assert "T4 shared (time-sliced)" in shared and "16 of 16 free" in shared
    assert "0.375/h" in shared or "0.38/h" in shared
    r = platform.spawn("gus", {"kind": "shared", "card": "T4"})
    assert r.status_code in (201, 202), r.text
    platform.wait_ready("gus")
    pod = pod_of(cluster, "gus")
    assert pod["spec"]["nodeName"] == "gpu-t4-shared"
    assert pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu.shared"] == "1"
    platform.stop_server("gus")


def test_bad_options_name_the_problem(platform):
    platform.create_user("dan")
    for options, message in [
        ({"kind": "card", "card": "A100-80GB", "count": 9}, "at most 8"),
        ({"kind": "card", "card": "T4"}, "this platform has no T4"),
        ({"kind": "slice", "card": "H100-80GB", "profile": "2g.20gb"}, "no H100-80GB 2g.20gb"),
        ({"kind": "card", "card": "L40S", "spot": "yes"}, "spot must be true or false"),
    ]:
        r = platform.spawn("dan", options)
        assert r.status_code == 400, r.text
        assert message in r.json()["message"], r.json()


def test_a_pods_server_registers_tensorboard_as_a_launcher_entry(platform, cluster):
    platform.create_user("ida")
    r = platform.spawn("ida", {"kind": "slice", "card": "H100-80GB", "profile": "1g.10gb"})
    assert r.status_code in (201, 202), r.text
    platform.wait_ready("ida")
    env = {
        e["name"]: e.get("value") for e in pod_of(cluster, "ida")["spec"]["containers"][0]["env"]
    }
    assert set(json.loads(env["GPUTAP_APPS"])) == {"tensorboard"}
    reach(platform, "ida")
    r = requests.get(
        f"{platform.url}/user/ida/server-proxy/servers-info",
        headers={"Authorization": f"token {platform.user_token('ida')}"},
        timeout=30,
    )
    assert r.status_code == 200, r.text[:300]
    [tensorboard] = r.json()["server_processes"]
    assert tensorboard["name"] == "tensorboard"
    assert tensorboard["launcher_entry"]["title"] == "TensorBoard"
    platform.stop_server("ida")
