"""GitHub organization and team names, one rule for every place that names them.

JupyterHub's groups made from a user's GitHub teams are ``org:team-slug`` in lower case (the
organization's login and the team's slug as in its URL, ``github.com/orgs/acme/teams/ml-staff``;
hub_config/github.py). A team named anywhere else (``hub.github.admin_teams``,
``hub.github.allowed_organizations``, ``courses.instructor_teams``, a course's ``github_team``)
is kept the same way, or it never matches a group: GitHub compares these names without case,
so they are lowered; a team's display name ("ML Staff") is no slug and is refused with the slug
GitHub would have made of it. Logins and slugs may hold ``_`` and ``.`` (Enterprise Managed
Users, slugs such as ``ml.staff``). A user's login (an instructor named in the settings or by
a billing admin) is kept by the same rule as an organization's: GitHub gives both from one
namespace.
"""

from __future__ import annotations

import re

from .bodies import shown

#: an organization's login (GitHub allows 39 characters)
ORG = re.compile(r"[a-z0-9][a-z0-9_.-]{0,38}")
#: a team's slug; with the login it fits billing's 140-character column
SLUG = re.compile(r"[a-z0-9][a-z0-9_.-]{0,99}")
TEAM_FORM = "'org:team-slug'"
#: a user's login as the hub names its users: a GitHub login in lower case (JupyterHub lowers
#: usernames; users and organizations share GitHub's logins, so ORG is their rule)
LOGIN_RULE = "1 to 39 of a-z, 0-9, '-', '_' and '.', starting with a letter or digit"


def login_name(value: object, field: str = "username") -> str:
    """``value`` as a user's login (``ada-lovelace``), lower case; ``ValueError`` naming
    ``field`` and what a login is otherwise: a path (``../../x``), a space or a control
    character is no login, and would never be a user of the hub."""
    name = value.lower() if isinstance(value, str) else None
    if name is not None and ORG.fullmatch(name):
        return name
    raise ValueError(f"{field} must be a login name: {LOGIN_RULE}; not {shown(value)}")


def team_name(value: object, field: str = "team") -> str:
    """``value`` as a team's ``org:team-slug``, stripped and lower case; ``ValueError`` naming
    ``field`` (and the slug to use when ``value`` reads as a display name) otherwise."""
    name = value.strip().lower() if isinstance(value, str) else None
    if name is not None:
        org, colon, slug = name.partition(":")
        if colon and ORG.fullmatch(org) and SLUG.fullmatch(slug):
            return name
    raise ValueError(f"{field} must be {TEAM_FORM}, not {value!r}{_team_hint(value)}")


def org_or_team(value: object, field: str = "organization") -> str:
    """``value`` as an organization's login (``acme``) or a team (``acme:ml-staff``), stripped
    and lower case; ``ValueError`` naming ``field`` otherwise."""
    name = value.strip().lower() if isinstance(value, str) else None
    if name is not None and ":" in name:
        try:
            return team_name(name, field)
        except ValueError:
            pass
    elif name is not None and ORG.fullmatch(name):
        return name
    hint = _team_hint(value)
    if not hint and isinstance(value, str):
        login = _slug_of(value)
        if ORG.fullmatch(login):
            hint = f"; use the organization's login as in its URL, github.com/{login}: {login}"
    raise ValueError(
        f"{field} must be an organization 'org' or a team {TEAM_FORM}, not {value!r}{hint}"
    )


def _slug_of(display: str) -> str:
    """The slug GitHub makes of a name: lower case, other characters than letters, digits,
    ``_`` and ``.`` turned into single dashes."""
    return re.sub(r"[^a-z0-9_.]+", "-", display.strip().lower()).strip("-")


def _team_hint(value: object) -> str:
    """'; use the team's slug as in its URL, ...' for a team written as a display name
    (``Acme:ML Staff``) or as GitHub mentions it (``@acme/ml-staff``); '' when none fits."""
    if not isinstance(value, str):
        return ""
    text = value.strip().removeprefix("@")
    parts = text.split(":") if ":" in text else text.split("/")
    if len(parts) != 2:
        return ""
    org, slug = (_slug_of(part) for part in parts)
    if not (ORG.fullmatch(org) and SLUG.fullmatch(slug)):
        return ""
    return f"; use the team's slug as in its URL, github.com/orgs/{org}/teams/{slug}: {org}:{slug}"
