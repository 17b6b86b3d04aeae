"""The chart's RBAC is complete and no wider than needed: a scenario that makes every kind of
Kubernetes request gputap makes (a GPU server and a MIG slice, a data disk attached and
detached, a worker group with its pod and NetworkPolicy, the node and pod watches, billing's
pod meter with its look at Killing events), run with the hub's and billing's own
ServiceAccount tokens, then the simulated API server's audit: no request of either was
refused, and each rendered rule, verb by verb and resource by resource, allowed at least one
request."""

import pytest
import requests

from tests.disks_client import started, user, wait_restarted
from tests.kube.conftest import (
    BILLING_ACCOUNT,
    HUB_ACCOUNT,
    NAMESPACE,
    kube_api,
    kube_platform,
    refused,
    rendered_rules,
    shared_homes,
    user_of,
)
from tests.kube.test_kube_spawn import pod_of
from tests.waiting import wait_for

SLICE = {"kind": "slice", "card": "H100-80GB", "profile": "1g.10gb"}
CARD = {"kind": "card", "card": "L40S", "count": 1}


@pytest.fixture(scope="module")
def platform(cluster, tmp_path_factory):
    """Homes on a shared file system, so that a server may scale out."""
    p = kube_platform(
        cluster, tmp_path_factory.mktemp("kube-rbac"), kubernetes=shared_homes(cluster)
    )
    p.start()
    yield p
    p.shutdown()


def unused_rules(cluster, chart_rbac, account: str) -> dict[str, set[tuple[str, str, str]]]:
    """By role, the (API group, resource, verb) of the account's rules that allowed none of
    its requests (a rule is used when it would allow one, whichever rule RBAC met first)."""
    used = {
        (r.api_group, r.resource, r.verb, r.scope)
        for r in cluster.audit
        if r.user == user_of(account) and r.allowed
    }
    unused: dict[str, set[tuple[str, str, str]]] = {}
    for role, scope, rule in rendered_rules(chart_rbac, account):
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    if not any(
                        u[:3] == (group, resource, verb) and (not scope or u[3] == scope)
                        for u in used
                    ):
                        unused.setdefault(role, set()).add((group, resource, verb))
    return unused


def billing_listed_killing_events(cluster) -> bool:
    return any(
        r.user == user_of(BILLING_ACCOUNT) and r.resource == "events" and r.verb == "list"
        for r in cluster.audit
    )


def test_every_rendered_rule_is_used_and_nothing_is_refused(platform, cluster, chart_rbac):
    # a whole GPU and a MIG slice, each a pod with its home's claim, watched by the hub
    platform.create_user("rosa")
    assert platform.spawn("rosa", CARD).status_code in (201, 202)
    disks = user(platform, "ravi")
    assert platform.spawn("ravi", SLICE).status_code in (201, 202)
    platform.wait_ready("rosa")
    before = started(platform, "ravi")

    # a data disk: created, attached (the claim's annotation patched, the pod restarted),
    # detached, deleted
    assert disks.create("ravi", {"name": "scratch", "size_gb": 2}).status_code == 201
    assert disks.attach("ravi", "scratch", "").status_code == 202
    during = wait_restarted(platform, "ravi", before)["started"]
    assert disks.detach("ravi", "scratch").status_code == 202
    wait_restarted(platform, "ravi", during)
    assert disks.delete("ravi", "scratch").status_code == 204

    # a worker beside ravi's server: its pod and the group's NetworkPolicy, then its stop
    token = platform.user_token("ravi")
    workers = f"{platform.url}/hub/gputap/api/users/ravi/server/workers"
    headers = {"Authorization": f"token {token}"}
    r = requests.post(workers, json={"count": 1}, headers=headers, timeout=30)
    assert r.status_code == 202, r.text

    def worker_states() -> list[str]:
        return [
            w["state"] for w in requests.get(workers, headers=headers, timeout=30).json()["workers"]
        ]

    wait_for(lambda: worker_states() == ["ready"], "ravi's worker ready", 120, step=0.3)
    assert requests.delete(workers, headers=headers, timeout=30).status_code == 202
    wait_for(lambda: worker_states() == ["stopped"], "ravi's worker stopped", 60, step=0.3)

    # rosa's pod vanishes while the hub and billing are down: billing, back, closes her
    # session at its Killing event, which it looks up
    platform.stop_hub()
    rosa_pod = pod_of(cluster, "rosa")["metadata"]["name"]
    # (the raw response: the client's model refuses the float cpu request KubeSpawner sent)
    kube_api(cluster).delete_namespaced_pod(rosa_pod, NAMESPACE, _preload_content=False)
    wait_for(lambda: _gone(cluster, "rosa"), "rosa's pod gone", 60, step=0.3)
    platform.start()
    wait_for(
        lambda: billing_listed_killing_events(cluster), "billing lists Killing events", 60, step=0.3
    )
    platform.stop_server("ravi")

    assert refused(cluster, HUB_ACCOUNT, BILLING_ACCOUNT) == []
    assert unused_rules(cluster, chart_rbac, BILLING_ACCOUNT) == {}
    assert unused_rules(cluster, chart_rbac, HUB_ACCOUNT) == {}


def _gone(cluster, username: str) -> bool:
    return not [
        p
        for p in cluster.pods(NAMESPACE)
        if p["metadata"].get("labels", {}).get("hub.jupyter.org/username") == username
    ]
