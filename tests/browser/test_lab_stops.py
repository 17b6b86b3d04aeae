"""A stop explains itself in Lab, in Chromium (docs/lab.md, "Why a server stopped"): a server
stopped for lack of credit while Lab is open shows why and what to do (not JupyterLab's stock
"Server unavailable or unreachable" dialog), its cost stops ticking, and the panel's Stop
button stops the server and says so.

With GPUTAP_SCREENSHOTS naming a folder, the reason shown after the credit stop is saved
there as lab-stop-explained.png.
"""

from __future__ import annotations

import time

import pytest
from playwright.sync_api import Page, expect

from tests.browser.shots import screenshot
from tests.browser.test_lab_e2e import log_in, open_panel
from tests.platform import Platform

T4 = {"kind": "card", "card": "T4", "count": 1}
STOCK = "Server unavailable or unreachable"


@pytest.fixture(scope="module")
def platform(tmp_path_factory):
    p = Platform(
        tmp_path_factory.mktemp("lab-stops"),
        extra={"billing": {"prices": {"T4": "3.60"}, "trial_credit": "10"}},
    )
    p.start()
    yield p
    p.shutdown()


def open_lab(platform: Platform, browser, name: str) -> Page:
    platform.create_user(name)
    assert platform.spawn(name, T4).status_code in (201, 202)
    platform.wait_ready(name)
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.set_default_timeout(90_000)
    log_in(page, platform.url, name)
    page.goto(f"{platform.url}/user/{name}/lab")
    open_panel(page)
    cost = page.get_by_test_id("gputap-cost-so-far")
    expect(cost).to_contain_text("credits")
    before = cost.inner_text()
    expect(cost).not_to_have_text(before, timeout=15_000)  # ticking
    return page


def test_a_credit_stop_in_open_lab_says_why_and_the_cost_freezes(platform, browser):
    page = open_lab(platform, browser, "petra")
    balance = platform.account("petra")["balance_micro"]
    # the credit is gone: billing's enforcer stops the server within a second or two
    platform.adjust("petra", f"-{balance / 1_000_000:.6f}")
    dialog = page.get_by_test_id("gputap-stopped")
    expect(dialog).to_be_visible(timeout=30_000)
    expect(page.get_by_test_id("gputap-stopped-message")).to_contain_text("your credit ran out")
    expect(page.get_by_test_id("gputap-stopped-todo")).to_contain_text(
        "Add credit on the billing page, then start again"
    )
    expect(page.locator(".jp-Dialog-header")).to_have_text("Out of credit: server stopped")
    expect(page.get_by_role("button", name="Billing page")).to_be_visible()
    platform.wait_stopped("petra")
    screenshot(page, "lab-stop-explained.png")

    # the cost stopped at the stop; no warning is left
    frozen = page.get_by_test_id("gputap-cost-so-far").inner_text()
    expect(page.get_by_test_id("gputap-stopped-at")).to_contain_text("nothing more is charged")
    expect(page.get_by_test_id("gputap-warning")).to_have_count(0)
    # past Lab's own check of the server (every 10 s): still one dialog, never the stock one
    time.sleep(12)
    assert page.get_by_test_id("gputap-cost-so-far").inner_text() == frozen
    expect(page.locator(".jp-Dialog")).to_have_count(1)
    assert STOCK not in page.content()
    page.get_by_role("button", name="Stay on this page").click()
    expect(page.locator(".jp-Dialog")).to_have_count(0)
    time.sleep(11)
    expect(page.locator(".jp-Dialog")).to_have_count(0)
    assert STOCK not in page.content()
    page.close()


def test_the_panels_stop_button_stops_the_server_and_says_who(platform, browser):
    page = open_lab(platform, browser, "stefan")
    page.get_by_test_id("gputap-stop-button").click()
    expect(page.get_by_test_id("gputap-stop-confirm")).to_contain_text("files are kept")
    page.locator(".jp-Dialog-button.jp-mod-warn").click()
    expect(page.get_by_test_id("gputap-stopped-message")).to_contain_text(
        "You stopped this server at", timeout=30_000
    )
    platform.wait_stopped("stefan")
    [session] = platform.sessions("stefan")
    assert session["state"] == "ended"
    # nothing else of stefan's runs: his credit stops falling with the server
    credit = page.get_by_test_id("gputap-balance")
    frozen = credit.inner_text()
    time.sleep(3)
    assert credit.inner_text() == frozen
    expect(page.get_by_test_id("gputap-stop-button")).to_be_disabled()
    # the hub's home links back: the dialog's Hub home button goes there
    page.get_by_role("button", name="Hub home").click()
    page.wait_for_url(lambda url: "/hub/home" in url or "/hub/spawn" in url)
    page.close()
