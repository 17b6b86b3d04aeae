"""The environment picker's script in Chromium: the form as render_form makes it, set into a
page of its own (no hub: the script needs only the form's HTML). Both directions of fit, the
filter box over 150 environments, and a course that pins its environment."""

import pytest
from playwright.sync_api import expect

from spawner.core.environment_form import Picker
from spawner.core.form import Choice, CourseOffer, render_form
from tests.unit.test_environment_form import A100, CATALOG, MINIMAL, SLICE, TEN, TF, TORCH, many


def form_page(browser, courses=()):
    page = browser.new_page()
    extra = many(148)[1:]  # with MINIMAL, TORCH and TF: the 150 of issue 16
    html = render_form(
        [Choice(SLICE, 3, 3, 1, 1_142_857), Choice(A100, 1, 1, 1, 8_000_000),
         Choice(CATALOG.cpu, 1, 1, 1, 100_000)],
        credit=TEN, simulated=False, preview_url="/p", courses=courses,
        picker=Picker([MINIMAL, TORCH, TF, *extra], "gputap"),
    )  # fmt: skip
    page.route("http://form.test/p?**", lambda route: route.fulfill(json={"message": "ok"}))
    body = f"<html><body><form>{html}</form></body></html>"
    page.route("http://form.test/", lambda route: route.fulfill(
        body=body, content_type="text/html; charset=utf-8"))  # fmt: skip
    page.goto("http://form.test/")
    return page


@pytest.fixture
def form(browser):
    page = form_page(browser)
    yield page
    page.close()


@pytest.fixture
def course_form(browser):
    """The form of a student whose course ML 101 pays for A100s and pins TensorFlow."""
    course = CourseOffer("ml-101", "ML 101", {A100.key: 3.0}, "Monday 00:00 UTC",
                         environment="tf")  # fmt: skip
    page = form_page(browser, [course])
    yield page
    page.close()


def env(page, key):
    return page.locator(f'.gputap-env:has(input[value="{key}"])')


def choice(page, value):
    return page.locator(f'input[name="choice"][value="{value}"]')


def test_picking_an_environment_disables_the_options_it_cannot_run_on_and_back(form):
    # the first free option, the 10 GB slice, is checked: torch (≥ 20 GB) is out, saying why
    expect(env(form, "torch").locator("input")).to_be_disabled()
    expect(env(form, "torch")).to_contain_text("A100-80GB 1g.10gb slice has 10 GB")
    choice(form, "card:A100-80GB").check()
    expect(env(form, "torch").locator("input")).to_be_enabled()
    env(form, "torch").locator("input").check()
    # now the options torch cannot run on are out, each saying why
    expect(choice(form, "cpu:cpu")).to_be_disabled()
    expect(form.locator('[data-key="cpu"]')).to_contain_text("needs a GPU")
    expect(choice(form, "slice:A100-80GB/1g.10gb")).to_be_disabled()
    expect(choice(form, "card:A100-80GB")).to_be_enabled()
    env(form, "gputap").locator("input").check()
    expect(choice(form, "cpu:cpu")).to_be_enabled()
    expect(form.locator('[data-key="cpu"] .gputap-env-unfit')).to_have_text("")


def test_the_filter_box_narrows_150_environments_by_name_and_tag(form):
    box = form.locator("#gputap-env-filter")
    box.fill("tensorflow")
    expect(env(form, "tf")).to_be_visible()
    expect(env(form, "torch")).to_be_hidden()
    expect(form.locator("#gputap-env-count")).to_have_text(" 31 of 150")
    box.fill("cuda-12.3 jax")
    expect(env(form, "env-012")).to_be_visible()
    expect(form.locator('.gputap-env-group[data-framework="PyTorch"]')).to_be_hidden()
    box.fill("no such thing")
    expect(form.locator("#gputap-env-none")).to_be_visible()


def test_a_course_that_pins_its_environment_selects_it(course_form):
    # the course's option comes first and is checked: its environment with it
    expect(course_form.locator('input[value="course:ml-101:card:A100-80GB"]')).to_be_checked()
    expect(env(course_form, "tf").locator("input")).to_be_checked()
    expect(env(course_form, "gputap").locator("input")).to_be_disabled()
    expect(env(course_form, "gputap")).to_contain_text(
        "the course you chose runs its servers in TensorFlow 2.20"
    )
    # the user's own options free the choice again
    choice(course_form, "card:A100-80GB").check()
    expect(env(course_form, "gputap").locator("input")).to_be_enabled()
