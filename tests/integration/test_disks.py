"""Data disks through the hub's API on one machine: create, attach to a running server (which
restarts with the disk in its home), detach, delete; limits, bad input, who may touch whose
disks, and billing's storage session from creation to deletion."""

import json
from pathlib import Path

import pytest
import requests

from tests.disks_client import Disks, needs_storage_billing, started, user, wait_restarted
from tests.platform import Platform

CPU = {"kind": "cpu"}


@pytest.fixture(scope="module")
def platform(tmp_path_factory):
    # billing runs on its own, so a test can take it away while the hub runs
    p = Platform(
        tmp_path_factory.mktemp("disks"),
        extra={"spawner": {"start_timeout": 60, "disks": {"max_size_gb": 20, "max_disks": 2}}},
        external_billing=True,
    )
    p.start()
    yield p
    p.shutdown()


@pytest.fixture(scope="module")
def storage_billing(platform):
    return needs_storage_billing(platform)


def disk_folder(platform: Platform, user: str, name: str) -> Path:
    return platform.root / "data" / "disks" / user / name


def session(platform: Platform, user: str, session_id: str) -> dict:
    [found] = [s for s in platform.sessions(user) if s["id"] == session_id]
    return found


# -- what needs no disk ------------------------------------------------------------------


def test_bad_input_is_refused_naming_the_field(platform):
    ann = user(platform, "ann")
    r = ann.list("ann")
    assert r.status_code == 200, r.text
    assert r.json()["disks"] == []
    assert r.json()["limits"] == {"max_size_gb": 20, "max_disks": 2}
    for body, field in [
        ({"name": "My Data", "size_gb": 1}, "name"),
        ({"name": "data-", "size_gb": 1}, "name"),
        ({"size_gb": 1}, "name"),
        ({"name": "data", "size_gb": 0}, "size_gb"),
        ({"name": "data", "size_gb": 21}, "size_gb"),
        ({"name": "data", "size_gb": "5"}, "size_gb"),
        ({"name": "data"}, "size_gb"),
        ({"name": "data", "size_gb": 1, "size": 2}, "size"),
        (["data", 1], "JSON object"),
    ]:
        r = ann.create("ann", body)
        assert r.status_code == 400, (body, r.text)
        assert field in r.json()["message"], (body, r.text)
    r = ann.s.post(f"{ann.base}/ann/disks", data="{not json", timeout=30)
    assert r.status_code == 400
    assert ann.names("ann") == {}
    assert not (platform.root / "data" / "disks" / "ann").exists()


# -- one disk's life ---------------------------------------------------------------------


def test_a_disk_attached_to_a_running_server_appears_in_its_home(platform, storage_billing):
    alice = user(platform, "alice")
    token = platform.user_token("alice")
    r = alice.create("alice", {"name": "data", "size_gb": 5})
    assert r.status_code == 201, r.text
    disk = r.json()
    assert disk["name"] == "data" and disk["size_gb"] == 5
    assert disk["attached_to"] is None and disk["attached_running"] is False
    assert disk_folder(platform, "alice", "data").is_dir()

    # billing meters it from now on: GB-hours at the storage price
    metered = session(platform, "alice", disk["billing_session_id"])
    assert (metered["sku"], metered["count"], metered["price_class"]) == ("disk", 5, "storage")
    assert metered["server_name"] == "disk:data" and metered["state"] == "running"
    listing = alice.list("alice").json()
    assert listing["price_per_gb_hour_micro"] == storage_billing["per_hour_micro"]
    assert listing["price_per_gb_hour"] == storage_billing["per_hour"]
    assert listing["currency"] == "credits"
    assert alice.create("alice", {"name": "data", "size_gb": 1}).status_code == 409

    assert platform.spawn("alice", CPU).status_code in (201, 202)
    before = started(platform, "alice")
    home = Path(platform.server_env("alice")["HOME"])
    assert json.loads(platform.server_env("alice")["GPUTAP_DISKS"]) == []

    r = alice.attach("alice", "data", "")
    assert r.status_code == 202, r.text
    assert r.json()["disk"]["attached_to"] == ""
    assert r.json()["restart"]["state"] == "stopping"
    wait_restarted(platform, "alice", before)
    path = str(home / "disks" / "data")
    assert json.loads(platform.server_env("alice")["GPUTAP_DISKS"]) == [
        {"name": "data", "path": path}
    ]
    [listed] = alice.list("alice").json()["disks"]
    assert listed["attached_running"] is True and listed["path"] == path
    # the server API shows the server's disks; the server's own token (the Lab extension's)
    # may use the disk API for its user
    r = alice.s.get(f"{platform.url}/hub/gputap/api/users/alice/server", timeout=30)
    assert r.status_code == 200 and r.json()["disks"] == [{"name": "data", "path": path}]
    own = Disks(platform, platform.server_env("alice")["JUPYTERHUB_API_TOKEN"])
    assert own.names("alice") == {"data": ""}

    # written inside the server, through its contents API: it lands on the disk
    r = requests.put(
        f"{platform.url}/user/alice/api/contents/disks/data/hello.txt",
        json={"type": "file", "format": "text", "content": "on the disk"},
        headers={"Authorization": f"token {token}"},
        timeout=30,
    )
    assert r.status_code in (200, 201), r.text
    assert (disk_folder(platform, "alice", "data") / "hello.txt").read_text() == "on the disk"

    r = alice.delete("alice", "data")
    assert r.status_code == 409 and "detach it first" in r.json()["message"]
    assert (disk_folder(platform, "alice", "data") / "hello.txt").exists()

    during = started(platform, "alice")
    r = alice.detach("alice", "data")
    assert r.status_code == 202, r.text
    assert r.json()["disk"]["attached_to"] is None and r.json()["restart"] is not None
    wait_restarted(platform, "alice", during)
    assert json.loads(platform.server_env("alice")["GPUTAP_DISKS"]) == []
    assert not (home / "disks" / "data").exists()  # the link is gone, the files are not
    assert (disk_folder(platform, "alice", "data") / "hello.txt").read_text() == "on the disk"

    assert alice.delete("alice", "data").status_code == 204
    assert not disk_folder(platform, "alice", "data").exists()
    assert alice.names("alice") == {}
    ended = session(platform, "alice", disk["billing_session_id"])
    assert ended["state"] == "ended" and ended["billed_seconds"] >= 1
    platform.stop_server("alice")


def test_limits(platform, storage_billing):
    lim = user(platform, "lim")
    assert lim.create("lim", {"name": "one", "size_gb": 20}).status_code == 201
    assert lim.create("lim", {"name": "two", "size_gb": 1}).status_code == 201
    r = lim.create("lim", {"name": "three", "size_gb": 1})
    assert r.status_code == 409 and "the most allowed" in r.json()["message"]
    assert lim.names("lim") == {"one": None, "two": None}
    assert len(platform.sessions("lim")) == 2  # the refused one was never metered


def test_a_disk_moves_only_from_a_stopped_server(platform, storage_billing):
    bea = user(platform, "bea")
    assert bea.create("bea", {"name": "data", "size_gb": 1}).status_code == 201
    r = bea.attach("bea", "data", "")  # the default server, never started: no restart
    assert r.status_code == 202 and r.json()["restart"] is None
    assert bea.names("bea") == {"data": ""}
    assert bea.attach("bea", "data", "nope").status_code == 404  # no such server

    assert platform.spawn("bea", CPU, server_name="two").status_code in (201, 202)
    before = started(platform, "bea", "two")
    r = bea.attach("bea", "data", "two")  # "" is stopped: the disk moves, "two" restarts
    assert r.status_code == 202, r.text
    assert r.json()["restart"]["reason"] == "mount disk data"
    wait_restarted(platform, "bea", before, "two")
    assert bea.names("bea") == {"data": "two"}
    home = Path(platform.server_env("bea", "two")["HOME"])
    assert (home / "disks" / "data").is_symlink()

    assert platform.spawn("bea", CPU).status_code in (201, 202)
    platform.wait_ready("bea")
    r = bea.attach("bea", "data", "")  # "two" runs with it
    assert r.status_code == 409 and "running server 'two'" in r.json()["message"]
    assert bea.names("bea") == {"data": "two"}
    platform.stop_server("bea")

    # "two" is removed with the disk attached: the disk can still be detached and deleted
    platform.stop_server("bea", "two")
    url = f"{platform.url}/hub/api/users/bea/servers/two"
    assert platform.api.delete(url, json={"remove": True}, timeout=30).status_code == 204
    r = bea.detach("bea", "data")
    assert r.status_code == 202 and r.json()["restart"] is None
    assert bea.delete("bea", "data").status_code == 204


# -- whose disks -------------------------------------------------------------------------


def test_nobody_touches_another_users_disks(platform, storage_billing):
    carl = user(platform, "carl")
    assert carl.create("carl", {"name": "data", "size_gb": 2}).status_code == 201
    assert carl.attach("carl", "data", "").status_code == 202
    (disk_folder(platform, "carl", "data") / "secret.txt").write_text("carl's")
    dan = user(platform, "dan")
    assert dan.create("dan", {"name": "mine", "size_gb": 1}).status_code == 201
    server_scopes = [
        "servers!server=dan/",
        "read:servers!server=dan/",
        "custom:gputap:disks!user=dan",
    ]
    r = platform.post("/users/dan/tokens", {"scopes": server_scopes, "expires_in": 3600})
    assert r.status_code == 201, r.text
    dan_server = Disks(platform, r.json()["token"])

    missing = dan.list("nobody")
    assert missing.status_code == 404
    for caller in (dan, dan_server):
        attempts = [
            caller.list("carl"),
            caller.create("carl", {"name": "evil", "size_gb": 1}),
            caller.delete("carl", "data"),
            caller.attach("carl", "data", ""),
            caller.detach("carl", "data"),
            caller.attach("carl", "mine", ""),  # dan's disk onto carl's server
            caller.s.get(f"{caller.base}/carl/disks/data", timeout=30),
        ]
        for r in attempts:
            assert r.status_code == 404, (r.request.method, r.request.url, r.text)
            assert r.json()["message"] == "No user 'carl'"
        assert missing.json()["message"] == "No user 'nobody'"
        # dan's own disk API answers, and knows no server of carl's
        assert caller.list("dan").status_code == 200
        r = caller.attach("dan", "mine", "carl/")
        assert r.status_code == 404 and "no server" in r.json()["message"]
    assert carl.names("carl") == {"data": ""}
    assert dan.names("dan") == {"mine": None}
    assert (disk_folder(platform, "carl", "data") / "secret.txt").read_text() == "carl's"


# -- billing away ------------------------------------------------------------------------


def test_without_billing_no_disk_is_created_or_deleted(platform, storage_billing):
    eve = user(platform, "eve")
    assert eve.create("eve", {"name": "kept", "size_gb": 1}).status_code == 201
    assert platform.spawn("eve", CPU).status_code in (201, 202)
    before = started(platform, "eve")
    platform.stop_billing()
    try:
        r = eve.create("eve", {"name": "new", "size_gb": 1})
        assert r.status_code == 503 and "nothing was created" in r.json()["message"]
        r = eve.delete("eve", "kept")
        assert r.status_code == 503 and "nothing was deleted" in r.json()["message"]
        # the running server could not start again without billing: it keeps running, and
        # the disk stays detached
        r = eve.attach("eve", "kept", "")
        assert r.status_code == 503 and "was not stopped" in r.json()["message"]
        assert eve.names("eve") == {"kept": None}  # the list still answers
        assert platform.server("eve")["started"] == before
    finally:
        platform.start_billing()
    platform.stop_server("eve")
    assert not disk_folder(platform, "eve", "new").exists()
    assert disk_folder(platform, "eve", "kept").is_dir()
    disks = [s for s in platform.sessions("eve") if s["price_class"] == "storage"]
    assert [s["server_name"] for s in disks] == ["disk:kept"]  # the refused one never metered
