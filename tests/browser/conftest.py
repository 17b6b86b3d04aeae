"""Chromium from Debian, driven by Playwright, headless."""

import time
from pathlib import Path

import pytest
from playwright.sync_api import Error, Page, expect, sync_playwright

from tests.platform import Platform

CHROMIUM = "/usr/bin/chromium"
# Lab and hub pages take seconds to load on a machine running four test workers on two
# cores: expect's own default of 5 s fails pages that are merely slow
expect.set_options(timeout=20_000)


#: what Chromium answers a navigation under way when any interface of the machine changes:
#: the simulated cluster's tests add a veth pair per pod beside the browser tests, and Chromium
#: drops requests under way at each (chromium issue 41465264), loopback ones included here
NETWORK_CHANGED = "net::ERR_NETWORK_CHANGED"


@pytest.fixture(scope="session", autouse=True)
def navigations_survive_other_tests_network_changes():
    """Page.goto tried again (up to 3 times) when, and only when, Chromium dropped it for a
    network change of the machine: an unrelated test's new pod, not anything of the page."""
    goto = Page.goto

    def goto_again(self, url, **kwargs):
        for attempt in range(3):
            try:
                return goto(self, url, **kwargs)
            except Error as e:
                if NETWORK_CHANGED not in str(e) or attempt == 2:
                    raise
                # a new pod's interfaces change several times in a row: let them settle, or
                # the page's own requests meet the next change
                time.sleep(2)

    Page.goto = goto_again
    yield
    Page.goto = goto


@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).exists():
        pytest.fail("Chromium is missing: `make test` installs it (apt-get install chromium)")
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        yield browser
        browser.close()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed browser test's report ends with the platform's log (hub, billing, servers):
    what the page saw is in the error, what the servers did around it only there."""
    report = yield
    platform = getattr(item, "funcargs", {}).get("platform")
    if report.when == "call" and report.failed and isinstance(platform, Platform):
        report.sections.append(("platform log, last lines", platform.log_tail(150)))
    return report
