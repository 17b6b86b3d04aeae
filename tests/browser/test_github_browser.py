"""A person in Chromium signs in with GitHub (the stand-in): the hub's button, the stand-in's
choose-a-user page, then back in the hub on the spawn form."""

import re

from playwright.sync_api import expect


def test_sign_in_with_github_lands_on_the_spawn_form(github_hub, github, browser, tmp_path):
    page = browser.new_page()
    page.set_default_timeout(30_000)
    page.goto(f"{github_hub.url}/hub/login")
    expect(page.get_by_text("Development login")).to_have_count(0)
    page.get_by_role("button", name="Sign in with GitHub").click()

    page.wait_for_url(re.compile(re.escape(github.url) + r"/login/oauth/authorize"))
    expect(page.locator("h1")).to_have_text("GitHub stand-in: choose a test user")
    expect(page.locator(".notice")).to_contain_text("No GitHub account is involved")
    page.screenshot(path=str(tmp_path / "choose.png"))
    page.click("#login-grace")

    page.wait_for_url(re.compile(re.escape(github_hub.url) + r"/hub/spawn"))
    expect(page.locator('input[value="slice:A100-80GB/1g.10gb"]')).to_be_visible()
    page.screenshot(path=str(tmp_path / "spawn.png"), full_page=True)
    assert github_hub.account("grace")["balance_micro"] == 10_000_000
