"""A server's lifecycle through GPUSpawnerMixin on the in-process spawner double
(tests/doubles/spawner.py): JupyterHub's Spawner, this machine's device pool, the strict
billing double; no hub and no process. Each start holds its devices and opens one session;
each way it ends (a stop, a crash found by poll, a refused start) gives the devices back and
closes the session once; a hub restart claims a running server's devices again."""

from __future__ import annotations

import pytest
from tornado import web
from tornado.httpclient import AsyncHTTPClient

from tests.doubles.billing import BillingDouble
from tests.doubles.spawner import SpawnerDouble, simulated_machine, spawner_double

RTX = {"kind": "card", "card": "RTX-4090", "count": 1}


@pytest.fixture
def billing() -> BillingDouble:
    return BillingDouble()


@pytest.fixture
def machine():
    return simulated_machine()


@pytest.fixture
def ada(machine, billing, tmp_path) -> SpawnerDouble:
    spawner = spawner_double("ada", machine, billing, tmp_path)
    spawner.user_options = dict(RTX)
    return spawner


def held(machine) -> dict[str, list[str]]:
    """Who holds which devices (no one before the devices were first read)."""
    return machine.pool_now.held_by() if machine.pool_now is not None else {}


async def test_a_start_holds_its_devices_opens_one_session_and_serves(ada, machine, billing):
    ip, port = await ada.start()
    response = await AsyncHTTPClient().fetch(f"http://{ip}:{port}/api")
    assert response.code == 200
    record = ada.record
    assert record.offering == "RTX-4090" and len(record.devices) == 1
    assert held(machine) == {"ada": list(record.devices)}
    assert billing.sessions == {record.session_id: None} and billing.holds == set()
    assert await ada.poll() is None


async def test_a_stop_gives_the_devices_back_and_closes_the_session_once(ada, machine, billing):
    await ada.start()
    session = ada.record.session_id
    await ada.stop()
    assert held(machine) == {} and ada.record is None
    ended = billing.sessions[session]
    assert ended is not None
    assert ada.stop_reason is not None
    assert await ada.poll() == 0  # the hub polls after a stop: nothing is settled again
    assert billing.sessions == {session: ended}


async def test_a_server_that_dies_is_settled_by_poll_until_last_seen_alive(ada, machine, billing):
    await ada.start()
    record = ada.record
    assert await ada.poll() is None
    seen_alive = ada._seen_alive
    ada.die()
    assert await ada.poll() == 1
    assert held(machine) == {} and ada.record is None
    assert billing.sessions[record.session_id] == seen_alive
    assert ada.stop_reason.kind == "died"
    await ada.stop()  # the hub's stop after a poll found it gone settles nothing twice
    assert billing.sessions[record.session_id] == seen_alive


async def test_a_start_billing_refuses_takes_nothing_and_reads_as_its_sentence(
    ada, machine, billing
):
    billing.refuse = 402
    with pytest.raises(web.HTTPError) as refused:
        await ada.start()
    assert refused.value.status_code == 402
    assert "credit" in refused.value.jupyterhub_message
    assert held(machine) == {} and billing.holds == set() and billing.sessions == {}
    assert ada.record is None and await ada.poll() == 0  # nothing was launched


async def test_invalid_options_are_a_400_that_changes_nothing(ada, machine, billing):
    ada.user_options = {"kind": "card", "card": "RTX-4090", "count": 99}
    with pytest.raises(web.HTTPError) as refused:
        await ada.start()
    assert refused.value.status_code == 400 and "count" in refused.value.log_message
    assert held(machine) == {} and billing.holds == set() and billing.sessions == {}


async def test_two_servers_never_get_the_same_device(machine, billing, tmp_path):
    spawners = [spawner_double(u, machine, billing, tmp_path) for u in ("ada", "bob")]
    for spawner in spawners:
        spawner.user_options = dict(RTX)
        await spawner.start()
    first, second = (set(s.record.devices) for s in spawners)
    assert first and second and not first & second
    assert set(held(machine)) == {"ada", "bob"}


async def test_a_hub_restart_claims_a_running_servers_devices_again(ada, billing, tmp_path):
    await ada.start()
    state, devices = ada.get_state(), list(ada.record.devices)
    restarted = simulated_machine()  # the new hub process reads its devices afresh
    again = spawner_double("ada", restarted, billing, tmp_path)
    await restarted.pool(again.catalog)
    again.load_state(state)
    assert again.record.session_id == ada.record.session_id
    assert held(restarted) == {"ada": devices}
    other = spawner_double("bob", restarted, billing, tmp_path)
    other.user_options = {"kind": "card", "card": "RTX-4090", "count": 2}
    with pytest.raises(web.HTTPError) as refused:  # the one RTX left is not two
        await other.start()
    assert refused.value.status_code == 409
    await ada.stop()
