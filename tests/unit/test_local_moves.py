"""An account move's folders on one machine (spawner/local/moves.py): the new name's folders
must be empty, and a rename failing half way leaves every folder where it was."""

from pathlib import Path

import pytest

from spawner.core.dirnames import safe_dirname
from spawner.lifecycle.moving import MoveRefused
from spawner.local import moves
from spawner.local.disks import LocalDiskStore


@pytest.fixture
def roots(tmp_path):
    homes = tmp_path / "homes"
    store = LocalDiskStore(tmp_path / "disks")
    (homes / "jo").mkdir(parents=True)
    (homes / "jo" / "notes.txt").write_text("mine")
    store.create_sync("jo", "data", 1)
    (store.folder("jo", "data") / "w.bin").write_bytes(b"\0\1")
    return homes, store


def tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_home_and_disks_move_and_back(roots):
    homes, store = roots
    (homes / safe_dirname("jo-new")).mkdir()  # empty: made room for
    before = tree(homes.parent)
    done = moves.apply(moves.plan(homes, store, "jo", "jo-new"))
    assert [d.name for _, d in done] == ["jo-2d-new", "jo-2d-new"]
    assert (homes / "jo-2d-new" / "notes.txt").read_text() == "mine"
    assert [d.name for d in store.list_sync("jo-new")] == ["data"]
    assert not (homes / "jo").exists() and store.list_sync("jo") == []
    moves.undo(done)
    assert tree(homes.parent) == before


def test_the_new_names_disks_or_files_refuse_before_anything_moves(roots):
    homes, store = roots
    store.create_sync("jo-new", "other", 1)
    with pytest.raises(MoveRefused, match=r"jo-new already has data disks \(other\)"):
        moves.plan(homes, store, "jo", "jo-new")
    (homes / "kim").mkdir()
    (homes / "kim" / "x").write_text("x")
    with pytest.raises(MoveRefused, match="kim's home .* is not empty"):
        moves.plan(homes, store, "jo", "kim")
    assert (homes / "jo" / "notes.txt").exists()


def test_a_rename_failing_half_way_moves_the_first_back(roots):
    homes, store = roots
    renames = moves.plan(homes, store, "jo", "jo-new")
    store.user_dir("jo").rename(store.root / "elsewhere")  # the disks' folder vanishes
    with pytest.raises(FileNotFoundError):
        moves.apply(renames)
    assert (homes / "jo" / "notes.txt").read_text() == "mine"  # the home moved back
    assert not (homes / "jo-2d-new").exists()
