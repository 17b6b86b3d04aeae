"""Signing in through the GitHub stand-in as a person does, in Chromium."""

import re


def sign_in(browser, platform, github, login):
    """A new page signed in as ``login``: the hub's login button, the stand-in's user link,
    back on the hub."""
    page = browser.new_context().new_page()
    page.set_default_timeout(30_000)
    page.goto(f"{platform.url}/hub/login")
    page.get_by_role("button", name="Sign in with GitHub").click()
    page.wait_for_url(re.compile(re.escape(github.url) + r"/login/oauth/authorize"))
    page.click(f"#login-{login}")
    page.wait_for_url(re.compile(re.escape(platform.url) + r"/hub/"))
    return page
