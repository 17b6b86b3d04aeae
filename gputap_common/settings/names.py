"""The settings that name GitHub organizations, teams and users, kept by the one rule of
``gputap_common/github_names.py``: lower case ``org`` or ``org:team-slug``, as the hub's groups
are, so that a team written ``Acme:ML-Staff`` matches the group ``acme:ml-staff``; a user's
login (``courses.instructors``) as the hub names users. The schema says only that these are
lists of strings; the loader applies this, so every reader of the settings (the hub's roles,
the demo) sees the names kept."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from ..github_names import login_name, org_or_team, team_name
from .validate import SettingsError

#: each setting that lists GitHub names -> the rule of its items
GITHUB_NAMES: dict[str, Callable[[object, str], str]] = {
    "hub.github.admin_teams": team_name,
    "hub.github.allowed_organizations": org_or_team,
    "courses.instructor_teams": team_name,
    "courses.instructors": login_name,
}


def github_name_list(path: str, values: list[Any]) -> list[str]:
    """The items of setting ``path`` kept by its rule, repeats dropped, in their order; a
    ``SettingsError`` naming the item (``courses.instructor_teams[0]``) and its fix."""
    rule = GITHUB_NAMES[path]
    kept: list[str] = []
    for i, value in enumerate(values):
        try:
            name = rule(value, f"{path}[{i}]")
        except ValueError as e:
            raise SettingsError(str(e)) from None
        if name not in kept:
            kept.append(name)
    return kept


def with_github_names(raw: dict[str, Any]) -> dict[str, Any]:
    """Loaded settings ``raw`` (every key present) with each GITHUB_NAMES setting kept."""
    result = copy.deepcopy(raw)
    for path in GITHUB_NAMES:
        *sections, key = path.split(".")
        node = result
        for section in sections:
            node = node[section]
        node[key] = github_name_list(path, node[key])
    return result
