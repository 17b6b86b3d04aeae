"""One machine's environments: the ``jupyterhub-singleuser`` of an environment's ``python``
(spawner/core/environments.py), found where a venv, a conda prefix or a bin folder keeps it."""

from __future__ import annotations

import os
from pathlib import Path

SINGLEUSER = "jupyterhub-singleuser"


class NoSingleuser(ValueError):
    """An environment's python holds no jupyterhub-singleuser; the message says where it was
    looked for."""


def singleuser_of(python: str) -> Path:
    """The ``jupyterhub-singleuser`` of ``python``: the program itself, or in its folder's
    ``bin`` (a venv, a conda prefix), or in the folder itself (a bin folder)."""
    where = Path(python)
    if not where.is_absolute():
        raise NoSingleuser(f"{python!r} is not an absolute path")
    candidates = (
        [where] if where.name == SINGLEUSER else [where / "bin" / SINGLEUSER, where / SINGLEUSER]
    )
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    looked = " or ".join(str(c) for c in candidates)
    raise NoSingleuser(f"no runnable {SINGLEUSER} at {looked}")


def interpreter_of(program: str | Path) -> str | None:
    """The interpreter a script's ``#!`` line names, or None (no such line, unreadable)."""
    try:
        with open(program, "rb") as f:
            first = f.readline(512)
        return first[2:].split()[0].decode() if first.startswith(b"#!") else None
    except (OSError, IndexError, UnicodeDecodeError):
        return None
