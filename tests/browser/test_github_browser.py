"""A person in Chromium signs in with GitHub (the stand-in): the hub's button, the stand-in's
choose-a-user page, then back in the hub on the spawn form. And GitHub as it fails and
restricts: the page when GitHub is down at login, the banner of an instructor whose
organization has not approved the app, the refusal of a renamed login taken by another."""

import re
import secrets

import pytest
import requests
from playwright.sync_api import expect

from tests.browser.github_login import sign_in
from tests.conftest import READER_SCOPES
from tests.github_sim import GitHubSim
from tests.github_sim.hub import hub_settings
from tests.platform import Platform


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


# -- GitHub that fails and restricts (issue 14) -----------------------------------------------


@pytest.fixture(scope="module")
def strict(tmp_path_factory):
    """Its own stand-in and hub: ines teaches (courses.instructor_teams: lab:teachers) in an
    organization that restricts OAuth apps; gil meets an outage; hana is renamed."""
    github = GitHubSim()
    for login in ("ines", "gil", "hana"):
        github.add_user(login, name=login.title())
    github.add_org("lab", restricts_apps=True)
    github.add_team("lab", "teachers", members=["ines"])
    reader = secrets.token_hex(16)
    with github.in_thread():
        settings = hub_settings(github)
        settings["courses"] = {"instructor_teams": ["lab:teachers"]}
        platform = Platform(
            tmp_path_factory.mktemp("strict"),
            extra=settings,
            services=[{"name": "reader", "api_token": reader, "scopes": READER_SCOPES}],
        )
        platform.reader = requests.Session()
        platform.reader.headers["Authorization"] = f"token {reader}"
        platform.start()
        yield github, platform
        platform.shutdown()


def test_github_down_at_login_shows_a_page_that_says_so_and_retries(strict, browser, tmp_path):
    github, platform = strict
    github.fail("/api/v3/user/teams", 503)
    try:
        page = sign_in(browser, platform, github, "gil")
        expect(page.locator("h1")).to_contain_text("503 : GitHub did not answer")
        expect(page.locator(".error")).to_contain_text(
            "GitHub did not answer gputap's request for your teams"
        )
        expect(page.locator(".error")).to_contain_text("try again in a minute")
        page.screenshot(path=str(tmp_path / "github-down.png"), full_page=True)
    finally:
        github.clear_faults()
    page.click("#gputap-github-retry")  # Sign in again: the stand-in, then the hub
    page.wait_for_url(re.compile(re.escape(github.url) + r"/login/oauth/authorize"))
    page.click("#login-gil")
    page.wait_for_url(re.compile(re.escape(platform.url) + r"/hub/spawn"))


def test_an_instructor_whose_org_has_not_approved_the_app_is_told_and_then_teaches(
    strict, browser, tmp_path
):
    github, platform = strict
    page = sign_in(browser, platform, github, "ines")
    page.goto(f"{platform.url}/hub/home")
    notice = page.locator('#gputap-github-notice .gputap-github-notice[data-org="lab"]')
    expect(notice).to_contain_text(
        "gputap cannot see your teams in lab: the organization has not approved gputap's "
        "GitHub app. Ask an owner of lab to approve it"
    )
    link = notice.get_by_role("link", name="Request approval from lab")
    expect(link).to_have_attribute(
        "href", f"{github.url}/settings/connections/applications/{github.client_id}"
    )
    page.screenshot(path=str(tmp_path / "not-approved.png"), full_page=True)
    page.goto(f"{platform.url}/services/billing/courses")
    expect(page.locator("#create")).to_have_count(0)  # not an instructor: teams unseen
    assert "GitHub hides organization lab from gputap for ines (oauth_app)" in (
        platform.log_tail(400)
    )

    github.approve_app("lab")
    page = sign_in(browser, platform, github, "ines")
    page.goto(f"{platform.url}/services/billing/courses")
    expect(page.locator("#create")).to_be_visible()
    page.goto(f"{platform.url}/hub/home")
    expect(page.locator(".gputap-github-notice")).to_have_count(0)
    expect(page.locator("#gputap-github-notice")).to_be_hidden()


def test_a_renamed_login_taken_by_someone_else_is_refused(strict, browser, tmp_path):
    github, platform = strict
    sign_in(browser, platform, github, "hana")
    before = platform.reader.get(f"{platform.url}/hub/api/users/hana", timeout=30).json()
    old_id = before["auth_state"]["github_user"]["id"]
    github.rename_user("hana", "hana-new")
    newcomer = github.add_user("hana", name="Another Hana")

    page = sign_in(browser, platform, github, "hana")
    expect(page.locator("h1")).to_contain_text("403")
    expect(page.locator(".error")).to_contain_text(
        "The GitHub login hana now belongs to a different GitHub account"
    )
    expect(page.locator(".error")).to_contain_text("sign in with your new login and ask an admin")
    page.screenshot(path=str(tmp_path / "renamed.png"), full_page=True)
    after = platform.reader.get(f"{platform.url}/hub/api/users/hana", timeout=30).json()
    assert after["auth_state"]["github_user"]["id"] == old_id != newcomer.id
    assert platform.account("hana")  # the renamed person's account is untouched
