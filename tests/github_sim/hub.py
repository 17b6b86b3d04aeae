"""Point a test platform's hub at the GitHub stand-in."""

from __future__ import annotations

from typing import Any

from .sim import GitHubSim


def declare_test_users(github: GitHubSim) -> None:
    """The people the GitHub-login tests sign in as.

    alice is in three acme teams (two pages at the stand-in's page size of 2), carol in
    acme:hub-admins, frank in acme:gpu-users, erin a private member of Initech; bob, dave
    and grace belong to nothing.
    """
    for login in ("alice", "bob", "carol", "dave", "erin", "frank", "grace"):
        github.add_user(login, name=login.title())
    github.add_org("acme", members=["alice"])
    for slug in ("a-team", "b-team", "c-team"):
        github.add_team("acme", slug, members=["alice"])
    github.add_team("acme", "hub-admins", members=["carol"])
    github.add_team("acme", "gpu-users", members=["frank"])
    github.add_org("Initech", members=["erin"])


def hub_settings(github: GitHubSim, **login: Any) -> dict[str, Any]:
    """`Platform(extra=...)` settings for GitHub login through `github`; `login` adds
    hub.github keys (allowed_organizations, admin_teams...). Servers share the hub's Unix
    user, as every test user is trusted."""
    return {
        "hub": {
            "github": {
                "client_id": github.client_id,
                "client_secret": github.client_secret,
                "url": github.url,
                **login,
            }
        },
        "spawner": {"start_timeout": 60, "allow_shared_unix_user": True},
    }
