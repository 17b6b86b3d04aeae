"""The billing service inside the real gputap platform (tests/platform.py), with two extra
automation tokens: one holding the hub's billing scope, one the billing admin scope."""

from __future__ import annotations

import secrets
from pathlib import Path

import requests

from tests.platform import Platform

HUB_SCOPES = ["custom:gputap-billing:hub", "access:services!service=billing"]


class Hub:
    def __init__(self, platform: Platform, hub_token: str):
        self.platform = platform
        self.url = platform.url
        self.hub_token = hub_token
        self.ops_token = platform.ops_token

    @property
    def billing(self) -> str:
        return f"{self.url}/services/billing/"

    def log(self) -> str:
        return self.platform.log_path.read_text(errors="replace")

    def user_token(self, username: str) -> str:
        """Create ``username`` on the hub and a token for them (as the ops service)."""
        self.platform.create_user(username)
        return self.platform.user_token(username)


class Caller:
    """Calls billing with one token: ``caller("GET", "api/me")``."""

    def __init__(self, base: str, token: str):
        self.base = base
        self.headers = {"Authorization": f"token {token}"}

    def __call__(self, method: str, path: str, **kwargs) -> requests.Response:
        return requests.request(
            method, self.base + path, headers=self.headers, timeout=10, **kwargs
        )


def user(hub: Hub, username: str) -> Caller:
    """Calls billing as ``username``, a user created on the hub for it."""
    return Caller(hub.billing, hub.user_token(username))


def start_hub(tmp: Path, **billing) -> Hub:
    """The platform with billing settings for these tests, and ``billing`` on top."""
    hub_token = secrets.token_hex(16)
    platform = Platform(
        tmp,
        extra={"billing": {"min_billable_seconds": 300, **billing}},
        services=[{"name": "hubsim", "api_token": hub_token, "scopes": HUB_SCOPES}],
    )
    platform.start()
    return Hub(platform, hub_token)


def stop_hub(hub: Hub) -> None:
    hub.platform.shutdown()
