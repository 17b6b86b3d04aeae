"""Billing, courses and admin are part of the hub (issue 12 point 3), in Chromium: the hub's
page frame and navigation on billing's pages and gputap's links on the hub's, pages that fit
a 390 px phone, a GPU-hours chart that reads at a glance, and each running server's card,
price and cost so far on the hub home and the hub admin page."""

from __future__ import annotations

import re
import secrets
from datetime import UTC, datetime, timedelta

import pytest
import requests
from playwright.sync_api import expect

from gputap_common.scopes import BILLING_ACCESS, BILLING_HUB
from tests.browser.shots import screenshot
from tests.platform import Platform

PHONE = {"width": 390, "height": 844}
RTX = {"kind": "card", "card": "RTX-4090"}  # 5.00/h
SLICE = {"kind": "slice", "card": "A100-80GB", "profile": "1g.10gb"}


@pytest.fixture(scope="module")
def platform(tmp_path_factory):
    # "history" writes past sessions through billing's API, as the hub does for a server
    # that ran while it was away: the chart needs days of use before today
    history = secrets.token_hex(16)
    p = Platform(
        tmp_path_factory.mktemp("hubpages"),
        extra={"hub": {"admin_users": ["ada"]}},
        services=[
            {"name": "history", "api_token": history, "scopes": [BILLING_HUB, BILLING_ACCESS]}
        ],
    )
    p.history_token = history
    p.start()
    yield p
    p.shutdown()


def past_session(platform, user: str, started: datetime, hours: float, count: int = 1) -> None:
    """A settled session of ``count`` RTX 4090s that ran ``hours`` from ``started``."""
    sid = "hist-" + secrets.token_hex(6)
    body = {
        "id": sid,
        "username": user,
        "server_name": "past",
        "sku": "RTX-4090",
        "count": count,
        "price_class": "on-demand",
        "started_at": started.isoformat(),
    }
    auth = {"Authorization": f"token {platform.history_token}"}
    base = f"{platform.url}/services/billing/api/"
    r = requests.post(base + "sessions", json=body, headers=auth, timeout=30)
    assert r.status_code in (200, 201), r.text
    ended = started + timedelta(hours=hours)
    r = requests.post(
        base + f"sessions/{sid}/stop",
        json={"ended_at": ended.isoformat()},
        headers=auth,
        timeout=30,
    )
    assert r.ok, r.text


def log_in(browser, platform, name: str, **context):
    page = browser.new_context(**context).new_page()
    page.set_default_timeout(30_000)
    page.goto(f"{platform.url}/hub/login")
    page.fill("#username_input", name)
    page.fill("#password_input", "anything")
    page.click("#login_submit")
    page.wait_for_url(lambda url: "/hub/login" not in url, wait_until="commit")
    return page


def phone(browser, platform, name: str):
    return log_in(browser, platform, name, viewport=PHONE, is_mobile=True, has_touch=True)


def page_width(page) -> int:
    return page.evaluate("document.documentElement.scrollWidth")


def midnight_days_ago(days: int) -> datetime:
    now = datetime.now(UTC)
    return datetime(now.year, now.month, now.day, tzinfo=UTC) - timedelta(days=days)


def day_label(day: datetime) -> str:
    return f"{day:%a} {day.day} {day:%b}"


def test_the_billing_page_fits_a_phone(platform, browser):
    platform.login("pia")
    platform.adjust("pia", "40.00")
    past_session(platform, "pia", midnight_days_ago(2) + timedelta(hours=9), 1.5)
    assert platform.spawn("pia", RTX).status_code in (201, 202)
    platform.wait_ready("pia")
    page = phone(browser, platform, "pia")
    page.goto(f"{platform.url}/services/billing/")
    expect(page.locator("#running tr.running-session")).to_have_count(1)
    expect(page.locator("#sessions tr.session")).to_have_count(1)
    assert page_width(page) <= PHONE["width"]
    # every table's key cell is on screen: the server's name, not scrolled away
    for cell in ("#running tr.running-session td", "#sessions tr.session td"):
        box = page.locator(cell).first.bounding_box()
        assert box and box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"], cell
    screenshot(page, "billing-phone.png", full_page=True)

    page.goto(f"{platform.url}/services/billing/courses")
    expect(page.locator("#join")).to_be_visible()
    assert page_width(page) <= PHONE["width"]
    platform.stop_server("pia")


def test_the_admin_pages_fit_a_phone(platform, browser):
    platform.login("ada")
    page = phone(browser, platform, "ada")
    page.goto(f"{platform.url}/services/billing/admin")
    expect(page.locator("#accounts tr.account").first).to_be_visible()
    assert page_width(page) <= PHONE["width"]
    page.goto(f"{platform.url}/hub/admin")
    expect(page.locator("#gputap-admin-servers")).to_be_attached()
    assert page_width(page) <= PHONE["width"]


def test_the_chart_reads_at_a_glance(platform, browser):
    platform.login("cho")
    platform.adjust("cho", "40.00")
    three, one = midnight_days_ago(3), midnight_days_ago(1)
    past_session(platform, "cho", three + timedelta(hours=10), 2)  # 2.00 GPU-hours
    past_session(platform, "cho", one + timedelta(hours=8), 0.25, count=2)  # 0.50 GPU-hours
    page = log_in(browser, platform, "cho")
    page.goto(f"{platform.url}/services/billing/")
    chart = page.locator("#gpu-hours-chart")
    expect(chart).to_be_visible()
    # the axis says what is counted, in which unit, with ticks from 0
    expect(chart.locator(".axis-title")).to_have_text("GPU-hours")
    ticks = [t.strip() for t in chart.locator(".tick").all_text_contents()]
    assert ticks[0] == "0" and len(ticks) >= 3, ticks
    assert [float(t) for t in ticks] == sorted(float(t) for t in ticks), ticks
    assert float(ticks[-1]) >= 2.0

    days = chart.locator("tr.chart-day")
    by_day = {}
    for i in range(days.count()):
        row = days.nth(i)
        by_day[row.get_attribute("data-day")] = row
    assert len(by_day) >= 7
    # each day is labelled with its date and its value in words beside the bar
    busy, light = by_day[three.date().isoformat()], by_day[one.date().isoformat()]
    expect(busy.locator(".day")).to_have_text(day_label(three))
    expect(light.locator(".day")).to_have_text(day_label(one))
    expect(busy.locator(".value")).to_have_text("2.00")
    expect(light.locator(".value")).to_have_text("0.50")
    idle = by_day[midnight_days_ago(2).date().isoformat()]
    expect(idle.locator(".value")).to_have_text("0")

    # the bars' lengths are to scale: 2.00 is four times 0.50, on the axis's scale
    def length(row) -> float:
        return row.locator("rect.bar").bounding_box()["width"]

    assert length(busy) == pytest.approx(4 * length(light), rel=0.02)
    assert length(idle) == 0
    track = busy.locator("svg.track").bounding_box()["width"]
    assert length(busy) == pytest.approx(track * 2.0 / float(ticks[-1]), rel=0.02)
    # a text alternative sums it up
    expect(chart.locator("figcaption")).to_contain_text("2.50 GPU-hours")
    expect(chart.locator("figcaption")).to_contain_text(f"most on {day_label(three)} (2.00)")


NAV = ["Home", "Token", "Services", "Billing", "Courses"]


def nav_links(page) -> list[str]:
    return [
        t.strip() for t in page.locator("#thenavbar .navbar-nav > .nav-item > a").all_inner_texts()
    ]


def test_billing_pages_and_hub_pages_share_one_navigation(platform, browser):
    platform.login("nia")
    page = log_in(browser, platform, "nia")
    pages = ["hub/home", "hub/token", "services/billing/", "services/billing/courses"]
    for path in pages:
        page.goto(f"{platform.url}/{path}")
        assert nav_links(page) == NAV, path
        expect(page.locator("#login_widget")).to_contain_text("nia")
        expect(page.locator("#logout")).to_have_attribute("href", re.compile(r"/hub/logout$"))
        # the hub's own stylesheet: Bootstrap's navbar lays its items out in a row
        display = page.evaluate("getComputedStyle(document.querySelector('nav.navbar')).display")
        assert display == "flex", path
        # the Services menu holds the courses page
        page.locator("#thenavbar a.dropdown-toggle").click()
        menu = page.locator("#thenavbar .dropdown-menu a")
        expect(menu.filter(has_text="Courses")).to_have_attribute(
            "href", "/services/billing/courses"
        )
    page.goto(f"{platform.url}/services/billing/")
    page.locator("#thenavbar .nav-link", has_text="Courses").click()
    expect(page.locator("h1")).to_have_text("Courses")
    page.locator("#thenavbar .nav-link", has_text="Home").click()
    page.wait_for_url(re.compile(r"/hub/home$"))
    page.locator("#thenavbar .nav-link", has_text="Billing").click()
    expect(page.locator("h1")).to_have_text("Billing for nia")

    # admins also get the hub's Admin link, on billing's pages too
    platform.login("ada")
    admin = log_in(browser, platform, "ada")
    for path in pages:
        admin.goto(f"{platform.url}/{path}")
        assert nav_links(admin) == NAV[:2] + ["Admin"] + NAV[2:], path


def money(text: str) -> int:
    """Exact credits as text -> micro-credits."""
    whole, _, fraction = text.partition(".")
    assert 2 <= len(fraction) <= 6, text
    return int(whole) * 1_000_000 + int(fraction.ljust(6, "0"))


def test_the_hub_home_shows_each_running_server_with_its_price_and_cost(platform, browser):
    platform.login("hana")
    platform.adjust("hana", "40.00")
    assert platform.spawn("hana", RTX).status_code in (201, 202)
    assert platform.spawn("hana", SLICE, server_name="small").status_code in (201, 202)
    platform.wait_ready("hana")
    platform.wait_ready("hana", server_name="small")
    page = log_in(browser, platform, "hana")
    page.goto(f"{platform.url}/hub/home")
    rows = page.locator("#gputap-servers .gputap-server")
    expect(rows).to_have_count(2)
    default = page.locator('#gputap-servers .gputap-server[data-server=""]')
    small = page.locator('#gputap-servers .gputap-server[data-server="small"]')
    expect(default.locator(".gputap-card")).to_contain_text("RTX-4090")
    expect(default.locator(".gputap-price")).to_have_text("5.00/h")
    # with how long its start took
    expect(default.locator(".gputap-status")).to_have_text(
        re.compile(r"running · ready \d+\.\d+ s after start")
    )
    expect(small.locator(".gputap-card")).to_contain_text("1g.10gb")
    [session] = [s for s in platform.account("hana")["running"] if s["server_name"] == "small"]
    expect(small.locator(".gputap-price")).to_have_text(f"{session['price_per_hour']}/h")
    # cost so far goes up while the page is open, in exact credits, and never past billing's
    first = money(default.locator(".gputap-cost").inner_text())
    expect(default.locator(".gputap-cost")).not_to_have_text(
        default.locator(".gputap-cost").inner_text(), timeout=10_000
    )
    later = money(default.locator(".gputap-cost").inner_text())
    [running] = [s for s in platform.account("hana")["running"] if s["server_name"] == ""]
    assert 0 < first < later <= running["cost_micro"]

    # a user's list holds only their own servers
    other = platform.login("ivo")
    r = other.get(
        f"{platform.url}/hub/gputap/api/running",
        headers={"X-XSRFToken": other.cookies.get("_xsrf")},
    )
    assert r.ok, r.text
    assert r.json()["servers"] == []

    # the hub admin page lists everyone's running servers, live; it needs admin
    r = other.get(
        f"{platform.url}/hub/gputap/api/running/all",
        headers={"X-XSRFToken": other.cookies.get("_xsrf")},
    )
    assert r.status_code == 403 and "read:servers" in r.json()["message"]
    platform.login("ada")
    admin = log_in(browser, platform, "ada")
    admin.goto(f"{platform.url}/hub/admin")
    section = admin.locator("#gputap-admin-servers")
    row = section.locator('tr.gputap-server[data-user="hana"][data-server="small"]')
    expect(row.locator(".gputap-card")).to_contain_text("1g.10gb")
    expect(row.locator(".gputap-price")).to_have_text(f"{session['price_per_hour']}/h")
    seen = money(row.locator(".gputap-cost").inner_text())
    expect(row.locator(".gputap-cost")).not_to_have_text(
        row.locator(".gputap-cost").inner_text(), timeout=10_000
    )
    assert money(row.locator(".gputap-cost").inner_text()) > seen

    platform.stop_server("hana", server_name="small")
    expect(small).to_have_count(0)
    expect(row).to_have_count(0)
    platform.stop_server("hana")


def test_the_hub_home_says_why_a_server_stopped(platform, browser):
    """An admin stops a user's server: the user's hub home says who stopped it and what to do,
    under that server, and the notice goes once the server is started again."""
    platform.login("jude")
    platform.adjust("jude", "10.00")
    assert platform.spawn("jude", SLICE).status_code in (201, 202)
    platform.wait_ready("jude")
    r = requests.post(
        f"{platform.url}/hub/gputap/api/users/jude/server/stop",
        headers={"Authorization": f"token {platform.user_token('ada')}"},
        timeout=60,
    )
    assert r.status_code in (202, 204), r.text
    platform.wait_stopped("jude")
    page = log_in(browser, platform, "jude")
    page.goto(f"{platform.url}/hub/home")
    notice = page.locator('#gputap-servers tr.gputap-notice[data-server=""]')
    expect(notice).to_contain_text("An admin (ada) stopped your server")
    expect(notice).to_contain_text("Start it again")
    assert platform.spawn("jude", SLICE).status_code in (201, 202)
    platform.wait_ready("jude")
    page.reload()
    expect(page.locator('#gputap-servers tr.gputap-notice[data-server=""]')).to_have_count(0)
    platform.stop_server("jude")
