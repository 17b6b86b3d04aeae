import secrets

import pytest
import requests

from tests.github_sim import GitHubSim
from tests.github_sim.hub import declare_test_users, hub_settings
from tests.platform import Platform

# what GitHub-login tests read through the hub's API besides the ops token's scopes
READER_SCOPES = ["list:groups", "read:groups", "list:users", "read:users", "admin:auth_state"]


@pytest.fixture(scope="module")
def platform(tmp_path_factory):
    p = Platform(tmp_path_factory.mktemp("platform"))
    p.start()
    yield p
    p.shutdown()


@pytest.fixture(scope="session")
def github():
    """The GitHub stand-in (tests/github_sim) with declare_test_users' people, paging by 2."""
    sim = GitHubSim(max_per_page=2)
    declare_test_users(sim)
    with sim.in_thread():
        yield sim


def github_platform(root, github, **login) -> Platform:
    """A started platform whose login is GitHub through the stand-in; `platform.reader` is a
    session holding READER_SCOPES."""
    reader = secrets.token_hex(16)
    p = Platform(
        root,
        extra=hub_settings(github, **login),
        services=[{"name": "reader", "api_token": reader, "scopes": READER_SCOPES}],
    )
    p.reader = requests.Session()
    p.reader.headers["Authorization"] = f"token {reader}"
    p.start()
    return p


@pytest.fixture(scope="session")
def github_hub(tmp_path_factory, github):
    """GitHub login open to any GitHub user; acme:hub-admins are admins. Shared by the
    integration and browser tests, which sign in as different people."""
    p = github_platform(tmp_path_factory.mktemp("github"), github, admin_teams=["acme:hub-admins"])
    yield p
    p.shutdown()
