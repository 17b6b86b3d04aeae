"""A person in Chromium: log in → pick a slice on the form → JupyterLab → stop → billing page."""

import re

from playwright.sync_api import expect


def test_login_form_spawn_lab_stop_and_see_the_bill(platform, browser, tmp_path):
    page = browser.new_page()
    page.set_default_timeout(90_000)
    page.goto(f"{platform.url}/hub/login")
    expect(page.get_by_text("Development login")).to_be_visible()
    page.fill("#username_input", "olivia")
    page.fill("#password_input", "anything")
    page.click("#login_submit")

    page.goto(f"{platform.url}/hub/spawn")
    option = page.locator('input[value="slice:A100-80GB/1g.10gb"]')
    expect(page.locator('[data-key="A100-80GB/1g.10gb"]')).to_contain_text("simulated")
    expect(page.locator('[data-key="A100-80GB/1g.10gb"]')).to_contain_text("3 of 3 free")
    # two RTX 4090s cost twice as much: the credit lasts half as long
    rtx = page.locator('[data-key="RTX-4090"]')
    expect(rtx.locator(".gputap-lasts")).to_have_text("credit lasts 2 h 00 min")
    rtx.locator("select").select_option("2")
    expect(rtx.locator(".gputap-lasts")).to_have_text("credit lasts 1 h 00 min")
    # the spec preview tells which card a need would get, before committing
    page.fill('input[name="spec_min_memory_gb"]', "32")
    page.fill('input[name="spec_min_tflops"]', "80")
    expect(page.locator("#gputap-spec-preview")).to_have_text(
        "You would get A100-80GB (simulated) at 8.00/h."
    )
    option.check()
    page.screenshot(path=str(tmp_path / "form.png"), full_page=True)
    page.locator('input[type="submit"], button[type="submit"]').last.click()

    page.wait_for_url(re.compile(r"/user/olivia/lab"))
    expect(page.locator("#jp-main-dock-panel")).to_be_visible()
    page.screenshot(path=str(tmp_path / "lab.png"))
    env = platform.server_env("olivia")
    assert env["GPUTAP_OFFERING"] == "A100-80GB/1g.10gb"
    assert env["CUDA_VISIBLE_DEVICES"].startswith("MIG-")

    page.goto(f"{platform.url}/hub/home")
    page.click("#stop")
    expect(page.locator("#start")).to_be_visible()

    page.goto(f"{platform.url}/services/billing/")
    session = page.locator("#sessions tr.session").first
    expect(session).to_contain_text("A100-80GB/1g.10gb")
    seconds = int(session.locator("td.seconds").inner_text())
    [billed] = platform.sessions("olivia")
    assert seconds == billed["billed_seconds"] > 0
    expect(page.locator("#balance")).to_have_text(
        re.compile(re.escape(platform.account("olivia")["balance"]))
    )
    page.screenshot(path=str(tmp_path / "billing.png"), full_page=True)
