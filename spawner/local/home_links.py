"""The links a server of an account of its own makes in its home as it starts, as that account:
its attached disks in ``~/disks`` and the shared data at their mount paths (a hub running as
root never works inside a home its user controls). The spawner's process setup and the
server pool's forked child (forkserver.py) both make them from the same plain description."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from .disks import link_disks
from .shared_data import link_shared_data


def describe(
    home: Path,
    disks: tuple[Path, Path, dict[str, Path], set[str]] | None,
    shared: list[dict[str, Any]],
) -> dict[str, Any]:
    """What to link: ``disks`` as the spawner has them (home, disks root, wanted, kept)."""
    described: dict[str, Any] = {"home": str(home), "shared": shared, "disks": None}
    if disks is not None:
        _, root, wanted, keep = disks
        described["disks"] = {
            "root": str(root),
            "wanted": {name: str(folder) for name, folder in wanted.items()},
            "keep": sorted(keep),
        }
    return described


def make(described: dict[str, Any]) -> None:
    """Make the links, as the server's account; what cannot be linked is said on stderr and
    the server starts without it."""
    home = Path(described["home"])
    disks = described.get("disks")
    if disks is not None:
        wanted = {name: Path(folder) for name, folder in disks["wanted"].items()}
        try:
            link_disks(home, Path(disks["root"]), wanted, disks["keep"])
        except OSError as e:
            print(f"gputap: disks not linked into ~/disks: {e}", file=sys.stderr)
    for path in link_shared_data(home, described["shared"]) if described["shared"] else []:
        print(f"gputap: {path} not linked into the home", file=sys.stderr)
