"""The simulated API server's store: selectors, resourceVersion, watch history."""

import pytest

from tests.kube_sim.store import ApiError, Store, fields_match, labels_match


def pod(name, ns="default", labels=None, phase="Pending", node=""):
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": labels or {}},
        "spec": {"nodeName": node} if node else {},
        "status": {"phase": phase},
    }


@pytest.mark.parametrize(
    "selector, labels, expected",
    [
        ("app=hub", {"app": "hub"}, True),
        ("app=hub", {"app": "proxy"}, False),
        ("app==hub", {"app": "hub"}, True),
        ("app!=hub", {"app": "proxy"}, True),
        ("app!=hub", {}, True),
        ("app!=hub", {"app": "hub"}, False),
        ("tier in (gpu, cpu)", {"tier": "gpu"}, True),
        ("tier in (gpu,cpu)", {"tier": "tpu"}, False),
        ("tier in (gpu,cpu)", {}, False),
        ("tier notin (gpu,cpu)", {"tier": "tpu"}, True),
        ("tier notin (gpu,cpu)", {}, True),
        ("tier notin (gpu,cpu)", {"tier": "gpu"}, False),
        ("gpu", {"gpu": ""}, True),
        ("gpu", {}, False),
        ("!gpu", {}, True),
        ("!gpu", {"gpu": "x"}, False),
        ("app=hub,tier in (gpu,cpu),!old", {"app": "hub", "tier": "cpu"}, True),
        ("app=hub,tier in (gpu,cpu),!old", {"app": "hub", "tier": "cpu", "old": "1"}, False),
        ("", {"anything": "x"}, True),
    ],
)
def test_label_selectors(selector, labels, expected):
    assert labels_match(selector, labels) is expected


def test_malformed_label_selector_is_refused():
    with pytest.raises(ValueError):
        labels_match("a in (x", {})


def test_field_selectors():
    p = pod("jupyter-ada", node="gpu-1", phase="Running")
    assert fields_match("metadata.name=jupyter-ada", p)
    assert fields_match("metadata.namespace=default,spec.nodeName=gpu-1", p)
    assert fields_match("status.phase!=Pending", p)
    assert not fields_match("status.phase=Pending", p)
    assert fields_match("spec.nodeName!=gpu-2", p)
    event = {"involvedObject": {"kind": "Pod", "name": "jupyter-ada"}, "metadata": {}}
    assert fields_match("involvedObject.kind=Pod,involvedObject.name=jupyter-ada", event)
    assert not fields_match("involvedObject.name=other", event)
    with pytest.raises(ValueError, match="not supported"):
        fields_match("spec.containers=x", p)


def test_resource_version_grows_on_every_write_and_is_a_string():
    store = Store()
    a = store.create(pod("a"), "pods")
    b = store.create(pod("b"), "pods")
    a2 = store.update("v1", "Pod", "default", "a", "pods", lambda o: o["metadata"].update(x=1))
    gone = store.remove("v1", "Pod", "default", "b", "pods")
    versions = [
        a["metadata"]["resourceVersion"],
        b["metadata"]["resourceVersion"],
        a2["metadata"]["resourceVersion"],
        gone["metadata"]["resourceVersion"],
    ]
    assert all(isinstance(v, str) for v in versions)
    assert [int(v) for v in versions] == sorted({int(v) for v in versions})
    assert store.resource_version == versions[-1]


def test_create_fills_identity_and_generate_name():
    store = Store()
    obj = store.create(
        {**pod(""), "metadata": {"generateName": "jupyter-", "namespace": "d"}}, "pods"
    )
    meta = obj["metadata"]
    assert meta["name"].startswith("jupyter-") and len(meta["name"]) > len("jupyter-")
    assert meta["uid"] and meta["creationTimestamp"].endswith("Z")


def test_duplicate_and_invalid_names_are_refused_with_kubernetes_reasons():
    store = Store()
    store.create(pod("a"), "pods")
    with pytest.raises(ApiError) as dup:
        store.create(pod("a"), "pods")
    assert (dup.value.code, dup.value.reason) == (409, "AlreadyExists")
    with pytest.raises(ApiError) as bad:
        store.create(pod("Not_A_Name"), "pods")
    assert (bad.value.code, bad.value.reason) == (422, "Invalid")
    assert bad.value.status()["details"] == {"name": "Not_A_Name", "kind": "pods"}


def test_stale_resource_version_on_replace_conflicts():
    store = Store()
    a = store.create(pod("a"), "pods")
    store.update(
        "v1", "Pod", "default", "a", "pods", lambda o: o["metadata"].update(labels={"z": "1"})
    )
    a["metadata"]["labels"] = {"x": "y"}
    with pytest.raises(ApiError) as e:
        store.replace(a, "pods")
    assert (e.value.code, e.value.reason) == (409, "Conflict")


def test_history_replays_from_a_resource_version_and_expires_when_compacted():
    store = Store(history_size=3)
    a = store.create(pod("a"), "pods")
    start = int(a["metadata"]["resourceVersion"])
    store.create(pod("b"), "pods")
    store.remove("v1", "Pod", "default", "a", "pods")
    assert [(e.type, e.key[3]) for e in store.events_since(start)] == [
        ("ADDED", "b"),
        ("DELETED", "a"),
    ]
    store.create(pod("c"), "pods")
    store.create(pod("d"), "pods")
    with pytest.raises(ApiError) as e:
        store.events_since(start)
    assert (e.value.code, e.value.reason) == (410, "Expired")


def test_list_filters_by_namespace_and_selectors():
    store = Store()
    store.create(pod("a", labels={"app": "x"}), "pods")
    store.create(pod("b", ns="other", labels={"app": "x"}), "pods")
    store.create(pod("c", labels={"app": "y"}, phase="Running"), "pods")
    names = lambda items: [o["metadata"]["name"] for o in items]  # noqa: E731
    assert names(store.list("v1", "Pod")) == ["a", "c", "b"]  # by namespace, then name
    assert names(store.list("v1", "Pod", "default")) == ["a", "c"]
    assert names(store.list("v1", "Pod", label_selector="app=x")) == ["a", "b"]
    assert names(store.list("v1", "Pod", field_selector="status.phase=Running")) == ["c"]
