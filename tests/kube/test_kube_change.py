"""Changing a server's GPU on the Kubernetes backend (docs/kubernetes.md, "Changing a
server's GPU"): the pod is replaced, billing ends the old session and opens the new one; the
server's own GPUs do not count as free for its change."""

from datetime import datetime

import requests

from tests.kube.test_kube_spawn import pod_of


def change_status(platform, user: str, timeout: float = 90) -> dict:
    url = f"{platform.url}/hub/gputap/api/users/{user}/server/change"

    def finished() -> dict | None:
        change = platform.api.get(url, timeout=10).json()
        return change if change["finished_at"] else None

    return platform.wait_for(finished, f"{user}'s change finished", timeout, step=0.3)


def test_a_pod_moves_to_another_node_and_billing_follows(platform, cluster):
    platform.create_user("kim")
    r = platform.spawn("kim", {"kind": "card", "card": "L40S", "count": 3})
    assert r.status_code in (201, 202), r.text
    platform.wait_ready("kim")
    token = platform.user_token("kim")
    url = f"{platform.url}/hub/gputap/api/users/kim/server"
    headers = {"Authorization": f"token {token}"}

    # 4 L40S exist and kim holds 3, but on Kubernetes those 3 count as taken: refused
    r = requests.post(
        f"{url}/change",
        json={"options": {"kind": "card", "card": "L40S", "count": 4}},
        headers=headers,
        timeout=30,
    )
    assert r.status_code == 409, r.text
    assert r.json()["message"].startswith("No 4× L40S on one machine free now (1 of 4 free)")
    choices = requests.get(f"{url}/choices", headers=headers, timeout=30).json()
    assert choices["current"] == "L40S" and choices["simulated"] is False
    assert {c["key"]: c["free"] for c in choices["choices"]}["L40S"] == 1

    slice_ = {"kind": "slice", "card": "H100-80GB", "profile": "1g.10gb"}
    r = requests.post(f"{url}/change", json={"options": slice_}, headers=headers, timeout=30)
    assert r.status_code == 202, r.text
    change = change_status(platform, "kim")
    assert (change["state"], change["from"], change["to"]) == (
        "done",
        "L40S",
        "H100-80GB/1g.10gb",
    ), change
    pod = pod_of(cluster, "kim")
    assert pod["spec"]["nodeName"] == "gpu-h100"
    assert pod["metadata"]["labels"]["gputap.io/slice"] == "1g.10gb"

    old, new = sorted(platform.sessions("kim"), key=lambda s: s["started_at"])
    assert (old["sku"], old["count"], old["state"]) == ("L40S", 3, "ended")
    assert (new["sku"], new["state"]) == ("H100-80GB/1g.10gb", "running")
    assert datetime.fromisoformat(new["started_at"]) >= datetime.fromisoformat(old["ended_at"])
    assert pod["metadata"]["annotations"]["gputap.io/session"] == new["id"]
    assert platform.ledger_problems() == []
    platform.stop_server("kim")
