"""An admin moves a renamed user's account from the hub's admin page, in Chromium: the form
says why a move is refused, then that it moved; the user, signed in with the new name,
finds their old credit."""

import pytest
from playwright.sync_api import expect

from tests.browser.test_hub_pages import log_in
from tests.platform import Platform

CPU = {"kind": "cpu"}


@pytest.fixture(scope="module")
def platform(tmp_path_factory):
    p = Platform(tmp_path_factory.mktemp("move-page"), extra={"hub": {"admin_users": ["ada"]}})
    p.start()
    yield p
    p.shutdown()


def test_an_admin_moves_an_account_from_the_admin_page(platform, browser):
    platform.login("mo")
    platform.adjust("mo", "4.00")
    platform.login("mo-2")  # the renamed login's first sign-in
    r = platform.spawn("mo", CPU)
    assert r.status_code in (201, 202), r.text
    platform.wait_ready("mo")

    admin = log_in(browser, platform, "ada")
    admin.on("dialog", lambda dialog: dialog.accept())
    admin.goto(f"{platform.url}/hub/admin")
    section = admin.locator("#gputap-move")
    section.get_by_label("Old name").fill("mo")
    section.get_by_label("New name").fill("mo-2")
    section.get_by_role("button", name="Move account").click()
    result = section.get_by_role("status")
    expect(result).to_have_text("Stop these servers first, then move: mo (nothing was moved)")

    platform.stop_server("mo")
    balance = platform.account("mo")["balance"]  # 14.00 less the seconds mo's server ran
    section.get_by_role("button", name="Move account").click()
    expect(result).to_have_text(
        f"Moved mo to mo-2 (credit {balance}). They sign in again with their new login."
    )
    assert platform.get("/users/mo").status_code == 404

    user = log_in(browser, platform, "mo-2")
    user.goto(f"{platform.url}/services/billing/")
    expect(user.locator("body")).to_contain_text(balance)
