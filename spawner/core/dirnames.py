"""Usernames as folder names: one path component each, different for different users.

Homes (spawner/local.py) and data disks (spawner/disks.py) name a user's folder the same way.
"""

from __future__ import annotations

import re


def safe_dirname(name: str) -> str:
    """A username as one path component, different for different names.

    Every character outside ``[A-Za-z0-9_.]`` (``-`` included) becomes ``-<hex>-``, and so does
    a leading dot, so two users never share a home and no name escapes ``homes_root``.
    """
    cleaned = re.sub(r"[^A-Za-z0-9_.]", lambda m: f"-{ord(m[0]):x}-", name)
    if cleaned.startswith("."):
        cleaned = "-2e-" + cleaned[1:]
    return cleaned or "-"
