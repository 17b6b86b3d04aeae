"""The hub's data disk API as a test calls it (tests/integration/test_disks.py and
tests/kube/test_kube_disk_mounts.py)."""

from __future__ import annotations

import time

import pytest
import requests

from tests.platform import Platform


class Disks:
    """The disk API as one caller (a token) sees it."""

    def __init__(self, platform: Platform, token: str):
        self.base = f"{platform.url}/hub/gputap/api/users"
        self.s = requests.Session()
        self.s.headers["Authorization"] = f"token {token}"

    def list(self, user: str) -> requests.Response:
        return self.s.get(f"{self.base}/{user}/disks", timeout=30)

    def create(self, user: str, body) -> requests.Response:
        return self.s.post(f"{self.base}/{user}/disks", json=body, timeout=30)

    def delete(self, user: str, name: str) -> requests.Response:
        return self.s.delete(f"{self.base}/{user}/disks/{name}", timeout=30)

    def attach(self, user: str, name: str, server: str) -> requests.Response:
        url = f"{self.base}/{user}/disks/{name}/attach"
        return self.s.post(url, json={"server": server}, timeout=30)

    def detach(self, user: str, name: str) -> requests.Response:
        return self.s.post(f"{self.base}/{user}/disks/{name}/detach", json={}, timeout=30)

    def names(self, user: str) -> dict[str, str | None]:
        r = self.list(user)
        assert r.status_code == 200, r.text
        return {d["name"]: d["attached_to"] for d in r.json()["disks"]}


def user(platform: Platform, name: str) -> Disks:
    """A new user of the platform and the disk API with their own token."""
    platform.create_user(name)
    return Disks(platform, platform.user_token(name))


def needs_storage_billing(platform: Platform) -> dict:
    """Billing's price of a GB-hour of disk (``per_hour_micro``, ``per_hour``); the test is
    skipped, saying why, when billing does not meter data disks (sku "disk", price class
    "storage")."""
    r = platform.billing("api/prices?sku=disk&price_class=storage")
    if r.status_code == 400:
        pytest.skip(
            "billing refuses the price class 'storage' (data disks are metered by billing's "
            f"storage sessions, not in this tree yet): {r.json().get('message')}"
        )
    assert r.ok, r.text
    return r.json()["prices"]["disk"]


def started(platform: Platform, name: str, server_name: str = "") -> str:
    """When the user's ready server started (the hub's server model)."""
    return platform.wait_ready(name, server_name=server_name)["started"]


def wait_restarted(platform: Platform, name: str, before: str, server_name: str = "") -> dict:
    """The server model once a server started after ``before`` is ready (a restart leaves
    no server for a moment)."""
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        server = platform.server(name, server_name)
        if server and server.get("ready") and server["started"] != before:
            return server
        time.sleep(0.2)
    raise AssertionError(f"{name}/{server_name} was not restarted:\n{platform.log_tail()}")
