"""Data disks without a hub: names, sizes, the one-machine store, and the links in homes."""

import asyncio
import json
import os
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spawner.core.disks import Disk, DiskConflict, DiskNotFound, check_name, check_size
from spawner.kube.disks import claim_name, disk_pod_settings, link_script
from spawner.local.disks import LocalDiskStore, link_disks


@pytest.mark.parametrize("name", ["a", "data", "imagenet-2024", "x1", "a" * 32, "a-b-c"])
def test_good_names_are_kept(name):
    assert check_name(name) == name


@pytest.mark.parametrize(
    "name",
    ["", "1data", "-data", "data-", "Data", "da_ta", "da--ta", "a" * 33, "dätä", "a/b", ".x", None],
)
def test_bad_names_say_what_a_name_must_be(name):
    with pytest.raises(ValueError) as e:
        check_name(name)
    assert "Field 'name'" in str(e.value) and "starting with a letter" in str(e.value)


def test_sizes_are_whole_gb_within_the_limit():
    assert check_size(1, 100) == 1
    assert check_size(100, 100) == 100
    for bad in (0, 101, -1, 1.5, "10", True, None):
        with pytest.raises(ValueError) as e:
            check_size(bad, 100)
        assert "Field 'size_gb'" in str(e.value) and "100" in str(e.value)


def test_a_record_survives_json():
    disk = Disk("data", 10, datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC), "", "s-1", 42)
    assert Disk.from_json(json.loads(json.dumps(disk.to_json()))) == disk


# -- the one-machine store ----------------------------------------------------------------


@pytest.fixture
def store(tmp_path):
    return LocalDiskStore(tmp_path / "disks", max_size_gb=50, max_disks=2)


async def test_create_list_attach_detach_delete(store, tmp_path):
    disk = await store.create("alice", "data", 10, "session-1")
    assert (disk.name, disk.size_gb, disk.attached_to, disk.billing_session_id) == (
        "data",
        10,
        None,
        "session-1",
    )
    folder = tmp_path / "disks" / "alice" / "data"
    assert folder.is_dir() and store.folder("alice", "data") == folder
    (folder / "weights.bin").write_bytes(b"x" * 1000)
    [listed] = await store.list("alice")
    assert listed.used_bytes == 1000 and listed.created_at == disk.created_at

    assert (await store.attach("alice", "data", "")).attached_to == ""  # the default server
    assert [d.name for d in await store.attached("alice", "")] == ["data"]
    assert await store.attached("alice", "gpu") == []
    with pytest.raises(DiskConflict, match="detach it first"):
        await store.delete("alice", "data")
    assert (folder / "weights.bin").exists()  # refused: nothing deleted

    assert (await store.attach("alice", "data", "gpu")).attached_to == "gpu"  # moved
    assert (await store.detach("alice", "data")).attached_to is None
    await store.delete("alice", "data")
    assert not folder.exists() and await store.list("alice") == []
    with pytest.raises(DiskNotFound):
        await store.get("alice", "data")


async def test_users_are_apart_and_names_are_safe(store, tmp_path):
    await store.create("alice", "data", 1)
    await store.create("../bob", "data", 1)
    assert [d.name for d in await store.list("alice")] == ["data"]
    assert sorted(p.name for p in (tmp_path / "disks").iterdir()) == ["-2e-.-2f-bob", "alice"]
    assert await store.list("carol") == []
    with pytest.raises(DiskNotFound):
        await store.get("alice", "../alice/data")


async def test_refusals_change_nothing(store, tmp_path):
    await store.create("alice", "data", 10)
    with pytest.raises(DiskConflict, match="already have a disk named 'data'"):
        await store.create("alice", "data", 5)
    with pytest.raises(ValueError, match="size_gb"):
        await store.create("alice", "big", 51)
    with pytest.raises(ValueError, match="name"):
        await store.create("alice", "Big", 5)
    await store.create("alice", "second", 1)
    with pytest.raises(DiskConflict, match="You have 2 disks, the most allowed"):
        await store.create("alice", "third", 1)
    assert [d.name for d in await store.list("alice")] == ["data", "second"]
    assert sorted(p.name for p in (tmp_path / "disks" / "alice").iterdir()) == [
        ".data.json",
        ".second.json",
        "data",
        "second",
    ]
    assert (await store.get("alice", "data")).size_gb == 10


async def test_a_leftover_folder_is_never_reused(store, tmp_path):
    (tmp_path / "disks" / "alice" / "data").mkdir(parents=True)
    (tmp_path / "disks" / "alice" / "data" / "old.txt").write_text("someone's")
    with pytest.raises(DiskConflict, match="in the way"):
        await store.create("alice", "data", 1)
    assert (tmp_path / "disks" / "alice" / "data" / "old.txt").read_text() == "someone's"
    assert await store.list("alice") == []


async def test_concurrent_creates_never_pass_the_limit(store):

    results = await asyncio.gather(
        *(store.create("alice", f"d{i}", 1) for i in range(6)), return_exceptions=True
    )
    assert sum(isinstance(r, Disk) for r in results) == 2
    assert all(isinstance(r, Disk | DiskConflict) for r in results)
    assert len(await store.list("alice")) == 2


@given(st.text(min_size=1, max_size=40))
def test_any_name_is_a_valid_name_or_a_value_error(name):
    try:
        check_name(name)
    except ValueError:
        return
    assert "/" not in name and not name.startswith(".") and claim_name("u", name).endswith(name)


# -- links in homes -----------------------------------------------------------------------


def test_links_follow_attachments_and_touch_nothing_else(tmp_path):
    root, home = tmp_path / "disks", tmp_path / "home"
    home.mkdir()
    assert link_disks(home, root, {}) == []
    assert list(home.iterdir()) == []  # no disks: no empty folder in the home
    a, b = root / "alice" / "a", root / "alice" / "b"
    a.mkdir(parents=True), b.mkdir(parents=True)
    assert link_disks(home, root, {"a": a, "b": b}) == []
    assert os.readlink(home / "disks" / "a") == str(a)
    (home / "disks" / "a" / "file").write_text("on the disk")
    assert (a / "file").read_text() == "on the disk"

    (home / "disks" / "notes.txt").write_text("mine")
    (home / "disks" / "elsewhere").symlink_to(tmp_path)
    (home / "disks" / "gone").symlink_to(root / "alice" / "deleted")  # a deleted disk's link
    assert link_disks(home, root, {"b": b}) == []
    assert sorted(p.name for p in (home / "disks").iterdir()) == ["b", "elsewhere", "notes.txt"]
    assert (a / "file").exists()  # unlinking never touches the disk

    (home / "disks" / "a").mkdir()  # the user's own folder where a link would go
    assert link_disks(home, root, {"a": a, "b": b}) == ["a"]
    assert not (home / "disks" / "a").is_symlink()


def test_links_of_disks_the_users_other_servers_mount_stay(tmp_path):
    root, home = tmp_path / "disks", tmp_path / "home"
    a, b = root / "alice" / "a", root / "alice" / "b"
    a.mkdir(parents=True), b.mkdir(parents=True)
    home.mkdir()
    assert link_disks(home, root, {"a": a}) == []  # the default server, with disk a
    # a named server starts with disk b: one home, so a's link must stay for the other
    assert link_disks(home, root, {"b": b}, keep={"a"}) == []
    assert sorted(p.name for p in (home / "disks").iterdir()) == ["a", "b"]


def test_a_disks_folder_that_is_a_link_is_never_followed(tmp_path):
    root, home, elsewhere = tmp_path / "disks", tmp_path / "home", tmp_path / "etc"
    a = root / "alice" / "a"
    a.mkdir(parents=True)
    home.mkdir(), elsewhere.mkdir()
    (elsewhere / "passwd").write_text("root:x:0:0")
    (elsewhere / "old").symlink_to(root / "alice" / "gone")
    (home / "disks").symlink_to(elsewhere)  # planted by the user
    assert link_disks(home, root, {"a": a}) == ["a"]
    assert sorted(p.name for p in elsewhere.iterdir()) == ["old", "passwd"]  # untouched
    (home / "disks").unlink()
    (home / "disks").write_text("a file")
    assert link_disks(home, root, {"a": a}) == ["a"]
    assert (home / "disks").read_text() == "a file"


# -- Kubernetes pod parts -----------------------------------------------------------------


def test_claims_of_different_users_and_disks_never_share_a_name():
    assert claim_name("alice", "data") == "disk-alice--data"
    assert claim_name("a", "b-c") != claim_name("a-b", "c")
    assert claim_name("Ada@Lovelace", "x").startswith("disk-ada-lovelace---")


def test_pods_mount_each_attached_disk():
    settings = disk_pod_settings("alice", ["data", "cache"])
    assert settings["volumes"] == [
        {"name": "disk-cache", "persistentVolumeClaim": {"claimName": "disk-alice--cache"}},
        {"name": "disk-data", "persistentVolumeClaim": {"claimName": "disk-alice--data"}},
    ]
    assert settings["volume_mounts"] == [
        {"name": "disk-cache", "mountPath": "/mnt/disks/cache"},
        {"name": "disk-data", "mountPath": "/mnt/disks/data"},
    ]
    assert settings["lifecycle_hooks"]["postStart"]["exec"]["command"][:2] == ["sh", "-c"]


def _run_hook(script: str, home: Path) -> None:
    subprocess.run(
        ["sh", "-c", script], env={"HOME": str(home), "PATH": "/bin:/usr/bin"}, check=True
    )


def test_the_pod_hook_links_mounted_disks_into_the_home(tmp_path):
    mounts, home = tmp_path / "mnt", tmp_path / "home"
    (mounts / "data").mkdir(parents=True)
    (mounts / "cache").mkdir()
    home.mkdir()
    _run_hook(link_script([], mount_root=str(mounts)), home)
    assert list(home.iterdir()) == []  # no disks: no empty folder in the home
    _run_hook(link_script(["data", "cache"], mount_root=str(mounts)), home)
    assert os.readlink(home / "disks" / "data") == f"{mounts}/data"
    assert os.readlink(home / "disks" / "cache") == f"{mounts}/cache"

    (home / "disks" / "mine").write_text("mine")
    (home / "disks" / "other").symlink_to("/tmp")
    _run_hook(link_script(["data"], mount_root=str(mounts)), home)  # cache detached
    assert sorted(p.name for p in (home / "disks").iterdir()) == ["data", "mine", "other"]
    # a named server without disks, while the default server mounts data: data's link stays
    _run_hook(link_script([], ["data"], mount_root=str(mounts)), home)
    assert sorted(p.name for p in (home / "disks").iterdir()) == ["data", "mine", "other"]
    _run_hook(link_script([], mount_root=str(mounts)), home)  # no disks: only ours go
    assert sorted(p.name for p in (home / "disks").iterdir()) == ["mine", "other"]
    assert (mounts / "data").is_dir()


def test_a_disk_still_mounted_by_a_server_not_yet_restarted_is_not_deleted_or_moved():
    from types import SimpleNamespace

    from tornado import web

    from spawner.api.disks import refuse_if_mounted

    mounted = [{"name": "data", "path": "/home/alice/disks/data"}]
    user = SimpleNamespace(
        spawners={
            "": SimpleNamespace(active=True, mounted_disks=mounted),  # detach's restart failed
            "gpu2": SimpleNamespace(active=False, mounted_disks=mounted),  # stopped: none
        }
    )
    with pytest.raises(web.HTTPError) as refused:
        refuse_if_mounted(user, "data")
    assert refused.value.status_code == 409
    assert "still mounted by your default server" in refused.value.log_message
    refuse_if_mounted(user, "data", but="")  # attaching back where it is mounted is fine
    refuse_if_mounted(user, "cache")


@pytest.mark.parametrize("name", ["data\n", "data\n\n", "imagenet\n"])
def test_a_name_with_a_trailing_newline_is_refused(name):
    # a newline would end up in the folder, the claim name and the link script
    with pytest.raises(ValueError, match="Field 'name' must be"):
        check_name(name)
