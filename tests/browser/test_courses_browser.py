"""Issue 5 in Chromium: an instructor (by GitHub team) creates a course bound to a team on
the courses page; a student of that team logs in with GitHub, sees the course's option first
with the hours left this week, and gets a server the course pays for."""

import re

import pytest
from playwright.sync_api import expect

from tests.browser.github_login import sign_in
from tests.github_sim import GitHubSim
from tests.github_sim.hub import hub_settings
from tests.platform import Platform


@pytest.fixture(scope="module")
def school(tmp_path_factory):
    github = GitHubSim(max_per_page=2)
    for login in ("tess", "sam", "una"):
        github.add_user(login, name=login.title())
    github.add_org("uni", members=["tess", "sam", "una"])
    github.add_team("uni", "teachers", members=["tess"])
    github.add_team("uni", "dl-2026", members=["sam"])
    with github.in_thread():
        settings = hub_settings(github)
        settings["courses"] = {"instructor_teams": ["uni:teachers"]}
        platform = Platform(tmp_path_factory.mktemp("school"), extra=settings)
        platform.start()
        yield github, platform
        platform.shutdown()


def test_instructor_creates_a_course_and_the_student_spawns_on_it(school, browser, tmp_path):
    github, platform = school
    tess = sign_in(browser, platform, github, "tess")
    tess.goto(f"{platform.url}/services/billing/courses")
    form = tess.locator("#create")
    form.locator('input[name="name"]').fill("Intro to DL")
    form.locator('input[name="weekly_hours"]').fill("6")
    form.locator('input[name="github_team"]').fill("uni:dl-2026")
    form.locator('input[name="more_allowed"]').fill("A100-80GB/1g.10gb")
    form.locator('input[name="allowed"][value="T4"]').check()
    form.get_by_role("button", name="Create").click()
    course = tess.locator('section.taught[data-slug="intro-to-dl"]')
    expect(course).to_contain_text("students of GitHub team uni:dl-2026 join at login")
    tess.screenshot(path=str(tmp_path / "instructor.png"), full_page=True)

    # sam is in uni:dl-2026: enrolled at login, the course's options come first
    sam = sign_in(browser, platform, github, "sam")
    sam.goto(f"{platform.url}/hub/spawn")
    group = sam.locator('fieldset.gputap-course-group[data-course="intro-to-dl"]')
    expect(group.locator("legend")).to_contain_text("Paid by Intro to DL")
    # 6 h of the dearest option (T4, 1.50/h) = 9.00: 6 h of T4, 7.8 h of the 1.14/h slice
    slice_row = group.locator('label[data-key="A100-80GB/1g.10gb"]')
    expect(slice_row).to_contain_text("7.8 h left this week (Intro to DL)")
    expect(group.locator('label[data-key="T4"]')).to_contain_text("6 h left this week")
    sam.screenshot(path=str(tmp_path / "student-form.png"), full_page=True)
    slice_row.locator("input").check()
    sam.get_by_role("button", name="Start").click()
    sam.wait_for_url(re.compile(r"/user/sam/"), timeout=90_000)
    [session] = platform.sessions("sam")
    assert (session["sku"], session["course"]) == ("A100-80GB/1g.10gb", "intro-to-dl")
    # a card the course does not pay for: refused, naming the course's rule
    refused = platform.post(
        "/users/sam/servers/big",
        {"user_options": {"kind": "card", "card": "RTX-4090", "course": "intro-to-dl"}},
    )
    assert refused.status_code == 400, refused.text
    assert refused.json()["message"] == (
        "Intro to DL pays for T4, A100-80GB/1g.10gb only, not RTX-4090. Pick one of those, "
        "or start without the course to pay with your own credit."
    )

    # una is not a student: no course options, and the API refuses the course
    una = sign_in(browser, platform, github, "una")
    una.goto(f"{platform.url}/hub/spawn")
    expect(una.locator("fieldset.gputap-course-group")).to_have_count(0)
    platform.stop_server("sam")
    student = platform.billing("api/accounts/sam/courses").json()["courses"][0]
    assert student["left_micro"] < 9_000_000  # the seconds it ran came off the allowance


def test_each_pays_for_checkbox_sits_on_the_line_of_its_own_label(school, browser):
    """The form's labels stack their text over their field; a checkbox's label must not (its
    box then sat on the line of the option before it)."""
    github, platform = school
    tess = sign_in(browser, platform, github, "tess")
    tess.goto(f"{platform.url}/services/billing/courses")
    choices = tess.locator('#create fieldset label:has(input[type="checkbox"])')
    assert choices.count() >= 2
    for i in range(choices.count()):
        label = choices.nth(i)
        box, whole = label.locator("input").bounding_box(), label.bounding_box()
        middle, line = box["y"] + box["height"] / 2, whole["y"] + whole["height"] / 2
        assert abs(middle - line) <= 3, (label.inner_text(), box, whole)
        assert box["x"] <= whole["x"] + 2, (label.inner_text(), box, whole)  # before its text
