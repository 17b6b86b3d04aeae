"""The credit banner on hub pages: it appears when billing warns that credit runs low, says
how much is left, and goes when the warning does, without reloading the page."""

import re

import pytest
from playwright.sync_api import expect

from tests.platform import Platform


@pytest.fixture(scope="module")
def platform(tmp_path_factory):
    p = Platform(
        tmp_path_factory.mktemp("banner"),
        extra={
            "hub": {"credit_banner_refresh_seconds": 1},
            "billing": {"warning_minutes": [15, 5]},
        },
    )
    p.start()
    yield p
    p.shutdown()


def test_the_banner_warns_while_credit_runs_low(platform, browser):
    page = browser.new_page()
    page.set_default_timeout(30_000)
    page.goto(f"{platform.url}/hub/login")
    page.fill("#username_input", "bea")
    page.fill("#password_input", "anything")
    page.click("#login_submit")
    page.goto(f"{platform.url}/hub/home")
    banner = page.locator("#gputap-credit-warning")
    expect(banner).to_be_hidden()  # nothing runs: nothing to warn about

    # 10.00 trial less 9.166667 leaves 0.833333: ten minutes of an RTX 4090 at 5.00/h
    platform.adjust("bea", "-9.166667")
    r = platform.spawn("bea", {"kind": "card", "card": "RTX-4090"})
    assert r.status_code in (201, 202), r.text
    platform.wait_ready("bea")
    expect(banner).to_be_visible()
    account = platform.account("bea")
    warning = account["warnings"][0]
    assert warning["threshold_seconds"] == 900
    expect(banner).to_contain_text(re.compile(r"About \d+ min of credit left at 5\.00/h"))
    expect(banner).to_contain_text(f"Credit left: {account['available'][:4]}")

    platform.stop_server("bea")
    expect(banner).to_be_hidden()


def test_the_banner_shows_own_credit_and_course_hours_apart(platform, browser):
    # a course student: 10.00 trial credit and 6 h of a slice a week from the course
    slice_ = "A100-80GB/1g.10gb"
    r = platform.billing(
        "api/courses", "POST", {"name": "Intro to DL", "allowed": [slice_], "weekly_hours": 6}
    )
    assert r.status_code == 201, r.text
    slug = r.json()["slug"]
    page = browser.new_page()
    page.set_default_timeout(30_000)
    page.goto(f"{platform.url}/hub/login")
    page.fill("#username_input", "cid")
    page.fill("#password_input", "anything")
    page.click("#login_submit")
    r = platform.billing(f"api/courses/{slug}/students", "POST", {"username": "cid"})
    assert r.status_code in (200, 201), r.text
    page.goto(f"{platform.url}/hub/spawn")  # the form shows the course's week (its allowance)
    expect(page.locator("#gputap-course-hours")).to_contain_text("Intro to DL")

    # own credit runs low on a server the credit pays for: the banner warns of the credit
    platform.adjust("cid", "-9.166667")
    r = platform.spawn("cid", {"kind": "card", "card": "RTX-4090"})
    assert r.status_code in (201, 202), r.text
    platform.wait_ready("cid")
    page.goto(f"{platform.url}/hub/home")
    banner = page.locator("#gputap-credit-warning")
    expect(banner).to_be_visible()
    account = platform.account("cid")
    own = account["credit"]["available_micro"]
    assert own < 1_000_000 < account["available_micro"]  # the course's allowance is not credit
    expect(banner).to_contain_text(re.compile(r"About \d+ min of credit left at 5\.00/h"))
    # "Credit left: 0.8…" is the own credit, never the own credit and the course's together
    expect(banner).to_contain_text(re.compile(r"Credit left: 0\.8\d* credits"))
    assert "Credit left: " + account["available"][:4] not in banner.inner_text()
    # and the course's hours are told apart, as the spawn form tells them
    expect(banner).to_contain_text(f"Intro to DL: 6 h of {slice_} left this week")
    platform.stop_server("cid")
    expect(banner).to_be_hidden()
