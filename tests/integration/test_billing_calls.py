"""The hub's calls to billing under load (issue 12, a class arriving at once): they never
wait behind the hub's readiness probes of starting servers, a billing that does not answer
in time is told as such (not as "unreachable"), and a hold that could not be released is
released once billing is back, as a session close is.

Billing is the real service inside the real platform; the calls are the hub's own client
(spawner.lifecycle.billing_client) with a token holding the hub's billing scope.
"""

import asyncio
import contextlib
import logging
import os
import secrets
import signal
import time
import uuid

import pytest
import tornado.web
from tornado.httpclient import AsyncHTTPClient
from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets

from spawner.core.record import ServerRecord
from spawner.lifecycle.billing_client import BillingClient, BillingUnavailable, unavailable_error
from spawner.lifecycle.metering import Metering
from tests.billing.hub import HUB_SCOPES
from tests.platform import Platform, billing_process

HUB_TOKEN = secrets.token_hex(16)


def billing_platform(root, **kw) -> Platform:
    p = Platform(
        root,
        services=[{"name": "hubsim", "api_token": HUB_TOKEN, "scopes": HUB_SCOPES}],
        **kw,
    )
    p.start()
    return p


@pytest.fixture(scope="module")
def platform(tmp_path_factory):
    p = billing_platform(tmp_path_factory.mktemp("billing-calls"))
    yield p
    p.shutdown()


@pytest.fixture(scope="module")
def outside_billing(tmp_path_factory):
    """Billing outside the hub, so the test can take it down and bring it back."""
    p = billing_platform(tmp_path_factory.mktemp("billing-calls-ext"), external_billing=True)
    yield p
    p.shutdown()


def client(platform: Platform, timeout: float = 10) -> BillingClient:
    """The hub's billing client, calling billing directly as the hub does."""
    url = f"http://127.0.0.1:{platform.billing_port}/services/billing/"
    return BillingClient(url, HUB_TOKEN, timeout=timeout)


class Starting(tornado.web.RequestHandler):
    """A single-user server still starting: it takes the connection, answers late."""

    async def get(self):
        await asyncio.sleep(30)


@contextlib.asynccontextmanager
async def starting_servers():
    sockets = bind_sockets(0, "127.0.0.1")
    server = HTTPServer(tornado.web.Application([(r".*", Starting)]))
    server.add_sockets(sockets)
    try:
        yield f"http://127.0.0.1:{sockets[0].getsockname()[1]}/user/x/api"
    finally:
        server.stop()


async def test_billing_calls_do_not_wait_behind_readiness_probes(platform):
    async with starting_servers() as url:
        # forty servers starting at once, each probed with the hub's shared HTTP client
        probes = [
            asyncio.ensure_future(
                AsyncHTTPClient().fetch(url, request_timeout=25, raise_error=False)
            )
            for _ in range(40)
        ]
        await asyncio.sleep(0.2)
        try:
            start = time.monotonic()
            answer = await client(platform, timeout=5).price_list(["cpu"])
            took = time.monotonic() - start
        finally:
            for probe in probes:
                probe.cancel()
    assert "cpu" in answer["prices"]
    assert took < 2, f"billing's answer waited {took:.1f} s behind the probes"


async def test_a_billing_that_does_not_answer_in_time_is_not_called_unreachable(platform):
    billing = billing_process(platform)
    os.kill(billing.pid, signal.SIGSTOP)  # up, its port open, but answering nothing
    try:
        with pytest.raises(BillingUnavailable) as caught:
            await client(platform, timeout=1).price_list(["cpu"])
    finally:
        os.kill(billing.pid, signal.SIGCONT)
    message = unavailable_error(caught.value).log_message
    assert message.startswith("Billing did not answer in time, so no server can start now")
    assert "nothing is charged" in message and "unreachable" not in message
    assert platform.billing_up()


async def test_a_hold_not_released_while_billing_is_down_is_released_when_it_is_back(
    outside_billing,
):
    platform = outside_billing
    await asyncio.to_thread(platform.create_user, "hana")
    billing = client(platform)
    await billing.open_account("hana")
    record = ServerRecord(session_id=str(uuid.uuid4()), offering="T4", count=1)
    answer = await billing.admit("hana", record)
    record.hold_id = answer["hold_id"]
    held = (await billing.account("hana"))["held_micro"]
    assert held > 0

    await asyncio.to_thread(platform.stop_billing)
    metering = Metering(billing, "hana", "", "hana", logging.getLogger("test"))
    await metering.release_hold(record)  # billing is down: it cannot be released now
    await asyncio.to_thread(platform.start_billing)

    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        account = await billing.account("hana")
        if account["held_micro"] == 0:
            break
        await asyncio.sleep(0.5)
    assert account["held_micro"] == 0, "the hold stayed until it expires by itself"
    assert account["available_micro"] == account["balance_micro"]
