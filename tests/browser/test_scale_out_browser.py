"""The panel's Scale out section in Chromium (issue 17, docs/scale-out.md, docs/lab.md): on a
simulated A100 1g.10gb slice, the price of two workers shows before starting, a request
beyond the hub's max_workers is refused with the hub's message and starts nothing, Start
brings two workers to ready with their cost ticking, Stop stops them, and billing has their
two sessions ended.

With GPUTAP_SCREENSHOTS naming a folder, the running group is saved there as
lab-scale-out.png.
"""

from __future__ import annotations

import pytest
import requests
from playwright.sync_api import expect

from gputap_common.money import format_credits
from tests.browser.shots import screenshot
from tests.browser.test_lab_e2e import log_in, open_panel
from tests.platform import Platform

SLICE = {"kind": "slice", "card": "A100-80GB", "profile": "1g.10gb"}
MAX_WORKERS = 3


@pytest.fixture(scope="module")
def platform(tmp_path_factory):
    p = Platform(
        tmp_path_factory.mktemp("scale-out-lab"),
        extra={"scale_out": {"max_workers": MAX_WORKERS, "idle_seconds": 0}},
    )
    p.start()
    yield p
    p.shutdown()


def workers(platform: Platform, name: str) -> list[dict]:
    r = requests.get(
        f"{platform.url}/hub/gputap/api/users/{name}/server/workers",
        headers={"Authorization": f"token {platform.user_token(name)}"},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    return r.json()["workers"]


def test_scale_out_from_the_panel(platform, browser):
    name = "wren"
    platform.create_user(name)
    assert platform.spawn(name, SLICE).status_code in (201, 202)
    platform.wait_ready(name)
    [server] = platform.sessions(name)
    price = server["price_per_hour_micro"] * server["count"]

    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.set_default_timeout(90_000)
    log_in(page, platform.url, name)
    page.goto(f"{platform.url}/user/{name}/lab")
    open_panel(page)

    # before starting: a worker of a slice is one slice; the price of two and how long
    # the credit lasts with them
    count = page.get_by_test_id("gputap-scale-count")
    expect(count).to_have_value("2")
    expect(page.get_by_test_id("gputap-scale-gpus")).to_be_disabled()
    expect(page.get_by_test_id("gputap-scale-price")).to_contain_text(
        f"{format_credits(2 * price)} credits/h"
    )
    expect(page.get_by_test_id("gputap-scale-lasts")).to_contain_text(
        f"at {format_credits(3 * price)}/h"
    )

    # more than the hub allows: its message here, nothing started
    count.fill(str(MAX_WORKERS + 1))
    page.get_by_test_id("gputap-scale-start").click()
    expect(page.get_by_test_id("gputap-scale-error")).to_contain_text(
        f"count must be 1 to {MAX_WORKERS}"
    )
    assert workers(platform, name) == []
    assert [s for s in platform.sessions(name) if s["worker"]] == []

    # two workers: both ready, each on its own slice, the group's cost ticking
    count.fill("2")
    page.get_by_test_id("gputap-scale-start").click()
    for worker in ("w1", "w2"):
        row = page.get_by_test_id(f"gputap-worker-{worker}")
        expect(row).to_have_attribute("data-state", "ready", timeout=90_000)
        expect(row).to_contain_text("A100-80GB 1g.10gb")
        expect(row.get_by_test_id("gputap-worker-gpu-note")).to_contain_text("simulated")
    expect(page.get_by_test_id("gputap-scale-error")).to_be_empty()
    expect(page.get_by_test_id("gputap-scale-rate")).to_contain_text(
        f"{format_credits(2 * price)} credits/h"
    )
    cost = page.get_by_test_id("gputap-scale-cost")
    before = cost.inner_text()
    expect(cost).not_to_have_text(before, timeout=10_000)
    page.get_by_test_id("gputap-scale").scroll_into_view_if_needed()
    screenshot(page, "lab-scale-out.png")

    # stop: both stopped, and billing ended both sessions
    page.get_by_test_id("gputap-scale-stop").click()
    for worker in ("w1", "w2"):
        row = page.get_by_test_id(f"gputap-worker-{worker}")
        expect(row).to_have_attribute("data-state", "stopped", timeout=60_000)
        expect(row.get_by_test_id("gputap-worker-reason")).to_contain_text("You stopped it")
    ended = {s["worker"]: s for s in platform.sessions(name) if s["worker"]}
    assert sorted(ended) == ["w1", "w2"]
    assert all(s["state"] == "ended" for s in ended.values())
    assert all(s["sku"] == "A100-80GB/1g.10gb" for s in ended.values())
    # the group's cost stays where the stop left it
    final = cost.inner_text()
    page.wait_for_timeout(2500)
    assert cost.inner_text() == final
    assert platform.ledger_problems() == []
    page.close()
