"""Shared data, read-only: what a server's environment says about the ``shared_data`` folders
(settings, rules in ``gputap_common/settings/shared_data.py``), the same on both backends.
Pure.

A ``models`` entry is a Hugging Face hub cache: ``HF_HUB_CACHE`` names it and
``HF_HUB_OFFLINE=1`` keeps ``from_pretrained`` from asking the Hub (a read-only cache cannot
take a download, and servers need not reach the internet), while ``HF_HOME`` stays in the
user's home, writable: tokens, the datasets cache and anything else Hugging Face writes.
``GPUTAP_SHARED_DATA`` lists every entry where the server sees it, for the Lab panel and the
user's own code.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import PurePosixPath
from typing import Any

MODELS = "models"
#: the user's own Hugging Face folder, in their home (its default place)
HF_HOME_IN_HOME = ".cache/huggingface"


def home_link(mount_path: str) -> str:
    """Where a mount path is in the home on one machine, relative to it: /models -> models,
    /data/imagenet -> data/imagenet."""
    return str(PurePosixPath(mount_path).relative_to("/"))


def shared_data_env(
    entries: Sequence[Mapping[str, Any]],
    *,
    home: str,
    seen_at: Callable[[Mapping[str, Any]], str],
    read_at: Callable[[Mapping[str, Any]], str] | None = None,
) -> dict[str, str]:
    """The environment a server gets for ``entries``: ``seen_at(entry)`` is the path the user
    is shown (the mount path, or the link in the home), ``read_at(entry)`` the one the models
    cache is read at (default: where it is seen). Empty without entries."""
    if not entries:
        return {}
    read_at = read_at or seen_at
    env = {
        "GPUTAP_SHARED_DATA": json.dumps(
            [{"name": e["name"], "kind": e["kind"], "path": seen_at(e)} for e in entries]
        )
    }
    for entry in entries:
        if entry["kind"] == MODELS:
            env["HF_HUB_CACHE"] = read_at(entry)
            env["HF_HUB_OFFLINE"] = "1"
            env["HF_HOME"] = str(PurePosixPath(home) / HF_HOME_IN_HOME)
    return env
