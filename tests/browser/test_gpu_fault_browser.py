"""A GPU fault in open Lab, in Chromium (docs/gpu-faults.md): the user is told at once what
failed and that billing stopped, the panel says the server is restarting, and Lab reloads
on its own once the server runs again on a healthy GPU, saying so.

With GPUTAP_SCREENSHOTS naming a folder, the notice is saved there as lab-gpu-fault.png.
"""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.browser.shots import screenshot
from tests.browser.test_lab_e2e import log_in, open_panel
from tests.integration.test_gpu_faults import T4, Machine


@pytest.fixture(scope="module")
def machine(tmp_path_factory):
    m = Machine(tmp_path_factory.mktemp("lab-gpu-fault"))
    m.platform.start()
    yield m
    m.platform.shutdown()


def test_a_gpu_fault_is_told_in_lab_and_lab_comes_back_on_a_healthy_gpu(machine, browser):
    p = machine.platform
    p.create_user("grace")
    assert p.spawn("grace", T4).status_code in (201, 202)
    p.wait_ready("grace")
    held = machine.held_by("grace")
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.set_default_timeout(90_000)
    log_in(page, p.url, "grace")
    page.goto(f"{p.url}/user/grace/lab")
    open_panel(page)

    machine.inject(int(held["label"].split()[1].rstrip(":")), {"xid": 79})
    toast = page.locator(".Toastify__toast").filter(has_text="The GPU of your server failed")
    expect(toast).to_be_visible(timeout=30_000)
    expect(toast).to_contain_text("XID 79 (GPU has fallen off the bus)")
    expect(toast).to_contain_text("Billing stopped at that second")
    fault = page.get_by_test_id("gputap-fault")
    expect(fault).to_be_visible()
    expect(page.get_by_test_id("gputap-fault-todo")).to_contain_text("starting your server again")
    screenshot(page, "lab-gpu-fault.png")

    # Lab reloads by itself when the server is back, and says where it runs now
    back = page.locator(".Toastify__toast").filter(has_text="back on a healthy GPU")
    expect(back).to_be_visible(timeout=120_000)
    assert machine.held_by("grace")["id"] != held["id"]
    open_panel(page)
    expect(page.get_by_test_id("gputap-fault")).to_be_hidden()
    page.close()
    p.stop_server("grace")


def test_the_admin_page_lists_gpus_and_drains_and_returns_one(machine, browser):
    p = machine.platform
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.set_default_timeout(60_000)
    log_in(page, p.url, "root")
    page.goto(f"{p.url}/hub/admin")
    section = page.locator("#gputap-gpus")
    rows = section.locator(".gputap-gpus-devices tr")
    expect(rows).to_have_count(len(machine.devices()))
    # the GPU the fault above took out is listed so, with its fault
    faulty = section.locator(".gputap-gpus-devices tr", has_text="faulty")
    expect(faulty).to_have_count(1)
    expect(faulty).to_contain_text("XID 79")
    expect(section.locator(".gputap-gpus-faults tr")).to_have_count(1)
    healthy = next(d for d in machine.devices() if d["state"] == "healthy" and not d["held_by"])
    row = section.locator(f".gputap-gpus-devices tr[data-id='{healthy['id']}']")
    page.once("dialog", lambda dialog: dialog.accept("fan noise"))
    row.get_by_role("button", name="Drain").click()
    expect(section.locator(".gputap-gpus-result")).to_contain_text("Drained")
    expect(row).to_contain_text("drained")
    expect(row).to_contain_text("fan noise")
    assert machine.device_by_id(healthy["id"])["state"] == "drained"
    row.get_by_role("button", name="Return").click()
    expect(row).to_contain_text("healthy")
    assert machine.device_by_id(healthy["id"])["state"] == "healthy"
    page.close()
