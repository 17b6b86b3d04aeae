"""Issue 12, points 1 and 4 in Chromium: a course student's course hours are not credit (the
spawn form and the billing page show own credit and each course's hours apart, "credit lasts"
counts what would pay, past sessions say what paid for them, the billing summary adds up on
its face), and a refusal on the form reads as a sentence, keeps what was picked and typed, and
offers alternatives that select their own row."""

from __future__ import annotations

import re
import time
from decimal import Decimal

from playwright.sync_api import expect

from tests.browser.shots import screenshot

SLICE = "A100-80GB/1g.10gb"  # 1.142857/h in the default book
COURSE = {"name": "Intro to DL", "allowed": [SLICE], "weekly_hours": 6}


def log_in(browser, platform, name):
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.set_default_timeout(60_000)
    page.goto(f"{platform.url}/hub/login")
    page.fill("#username_input", name)
    page.fill("#password_input", "anything")
    page.click("#login_submit")
    page.wait_for_url(re.compile(r"/hub/"))
    return page


def credits(text: str) -> Decimal:
    return Decimal(text.strip().split()[0])


def run_for(platform, name, options, seconds=2.5):
    r = platform.spawn(name, options)
    assert r.status_code in (201, 202), r.text
    platform.wait_ready(name)
    time.sleep(seconds)
    platform.stop_server(name)


def test_course_hours_are_not_credit_on_the_form_and_the_billing_page(platform, browser):
    page = log_in(browser, platform, "cora")
    r = platform.billing("api/courses", "POST", COURSE)
    assert r.status_code == 201, r.text
    slug = r.json()["slug"]
    r = platform.billing(f"api/courses/{slug}/students", "POST", {"username": "cora"})
    assert r.status_code in (200, 201), r.text

    # the form: own credit (10.00 trial) apart from the course's 6 h (6.857142 of allowance)
    page.goto(f"{platform.url}/hub/spawn")
    expect(page.locator("#gputap-available")).to_have_text("10.00")
    expect(page.locator("#gputap-trial")).to_have_text("trial 10.00")
    expect(page.locator("#gputap-course-hours")).to_contain_text(
        f"Intro to DL: 6 h of {SLICE} left this week"
    )
    # an option paid from credit lasts what the credit pays for (10.00 at 5.00/h), never
    # counting the course's hours as credit
    rtx = page.locator('.gputap-choice[data-key="RTX-4090"]')
    expect(rtx.locator(".gputap-lasts")).to_have_text("credit lasts 2 h 00 min")
    course_row = page.locator(f'label.gputap-course[data-key="{SLICE}"]')
    expect(course_row).to_contain_text("6 h left this week (Intro to DL)")

    run_for(
        platform,
        "cora",
        {"kind": "slice", "card": "A100-80GB", "mig_profile": "1g.10gb", "course": slug},
    )
    run_for(platform, "cora", {"kind": "card", "card": "RTX-4090"})
    r = platform.spawn("cora", {"kind": "card", "card": "T4"})
    assert r.status_code in (201, 202), r.text
    platform.wait_ready("cora")
    time.sleep(2)

    page.goto(f"{platform.url}/services/billing/")
    account = platform.account("cora")
    own = account["credit"]
    # the balance is the own credit: trial + paid, not the course's allowance
    trial, paid = (account["pools"][p]["balance_micro"] for p in ("trial", "paid"))
    expect(page.locator("#balance")).to_have_text(own["balance"])
    assert own["balance_micro"] == trial + paid < account["balance_micro"]
    expect(page.locator("#trial")).to_have_text(account["pools"]["trial"]["balance"])
    course = page.locator(f'#course-hours tr.course[data-course="{slug}"]')
    expect(course).to_contain_text("Intro to DL")
    expect(course.locator("td.hours")).to_contain_text(
        re.compile(r"5\.\d h of " + re.escape(SLICE))
    )
    on_billing = course.locator("td.hours").inner_text().strip()

    # the summary adds up on its face, read at one moment
    shown = page.evaluate(
        """() => Object.fromEntries(["trial", "paid", "balance", "uncharged", "available",
             "held", "free", "running-cost", "charged"].map(
               (id) => [id, document.getElementById(id).textContent]))"""
    )
    n = {k: credits(v) for k, v in shown.items()}
    assert n["trial"] + n["paid"] == n["balance"], shown
    assert n["balance"] - n["uncharged"] == n["available"], shown
    assert n["available"] - n["held"] == n["free"], shown
    assert n["charged"] + n["uncharged"] == n["running-cost"], shown

    # past sessions say what paid for them
    rows = page.locator("#sessions tr.session")
    expect(rows).to_have_count(2)
    expect(rows.nth(0).locator("td.paid-by")).to_have_text("trial")  # RTX-4090, newest first
    expect(rows.nth(1).locator("td.paid-by")).to_have_text("course Intro to DL")
    listed = {
        s["sku"]: s for s in platform.billing("api/sessions?username=cora").json()["sessions"]
    }
    assert listed[SLICE]["paid_by_text"] == "course Intro to DL"
    assert [p["pool"] for p in listed["RTX-4090"]["paid_by"]] == ["trial"]

    page.set_viewport_size({"width": 1280, "height": 900})
    screenshot(page, "billing-page.png", full_page=True)
    # the courses page says the course's figure as the billing page does (one rule: floored,
    # so 5.99 h is 5.9 h on both, not 6.0 h on one); the course pays for nothing running now
    page.goto(f"{platform.url}/services/billing/courses")
    taken = page.locator(f'#taken tr.taken[data-slug="{slug}"] td.num')
    assert taken.inner_text().strip() == on_billing
    platform.stop_server("cora")


def test_a_refusal_on_the_form_is_a_sentence_that_keeps_the_choices(platform, browser):
    # the one T4 is taken: a second user's pick of it is refused
    platform.create_user("rex")
    r = platform.spawn("rex", {"kind": "card", "card": "T4"})
    assert r.status_code in (201, 202), r.text
    platform.wait_ready("rex")
    page = log_in(browser, platform, "fay")
    page.goto(f"{platform.url}/hub/spawn")
    page.fill('input[name="spec_min_memory_gb"]', "24")
    t4 = page.locator('input[name="choice"][value="card:T4"]')
    t4.check()
    page.locator('input[type="submit"], button[type="submit"]').last.click()

    refusal = page.locator("#gputap-refusal")
    expect(refusal).to_contain_text(re.compile(r"^No T4 free now"))
    body = page.locator("body").inner_text()
    assert "HTTP 409" not in body and "Error:" not in body, body[:2000]
    # what was picked and typed is still there
    expect(t4).to_be_checked()
    expect(page.locator('input[name="spec_min_memory_gb"]')).to_have_value("24")
    # the sold-out row's alternatives select their own row, never the sold-out one
    alternative = page.locator('.gputap-choice[data-key="T4"] .gputap-pick').first
    value = alternative.get_attribute("data-pick")
    alternative.click()
    expect(page.locator(f'input[name="choice"][value="{value}"]')).to_be_checked()
    expect(t4).not_to_be_checked()
    # and so do the refusal's own
    t4.check()
    refusal.locator(".gputap-pick").first.click()
    expect(t4).not_to_be_checked()
    platform.stop_server("rex")


def test_an_option_the_credit_cannot_start_is_marked_before_start(platform, browser):
    page = log_in(browser, platform, "una")
    platform.adjust("una", "-9.99")  # 0.01 left: not even 5 s (the minimum) of an A100
    page.goto(f"{platform.url}/hub/spawn")
    a100 = page.locator('.gputap-choice[data-key="A100-80GB"]')
    expect(a100.locator('input[name="choice"]')).to_be_disabled()
    expect(a100.locator(".gputap-short")).to_have_text(
        "Not enough credit: needs 0.011111 credits for the first 5 s (the least a server is "
        "billed); you have 0.01."
    )
