"""The front end in JupyterLab, in Chromium: status bar, panel, disks, a change of GPU.

JupyterLab runs with the extension as `make setup` installs it, against the stand-in hub;
a change's restart is played by the stand-in (its change status turns "done"), and Lab
must reload on the same workspace and say how the change ended.
"""

from __future__ import annotations

import re
import time

import pytest
import requests
from playwright.sync_api import expect

from tests.browser.conftest import browser  # noqa: F401  (the Chromium fixture)
from tests.lab.conftest import hub_env

LAB_CONFIG = {"news_url": None, "check_for_updates_class": "jupyterlab.NeverCheckForUpdate"}
WARNING = (
    "About 25 min of credit left at 1.142857/h; running servers stop when it runs out "
    "(files are kept). Stop a server or ask for credit to keep going."
)


@pytest.fixture
def fresh_hub(hub):
    state, url = hub
    state.seen.clear()
    state.disks.clear()
    state.change = None
    state.simulated = True
    state.warnings = []
    return state, url


def open_lab(browser, server, path: str = ""):  # noqa: F811
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    where = f"lab/tree/{path}" if path else "lab"
    page.goto(f"{server.url}{where}?token={server.token}")
    page.wait_for_selector("[data-testid=gputap-status]", timeout=60_000)
    return page


def test_panel_disks_and_change_of_gpu(browser, lab_server, fresh_hub):  # noqa: F811
    state, url = fresh_hub
    state.simulated = False
    state.warnings = [
        {"threshold_seconds": 1800, "seconds_left": 1500, "course": None, "message": WARNING}
    ]
    env = hub_env(state, url) | {"GPUTAP_SIMULATED": "0"}
    server = lab_server("BusyGPU", env=env, config={"LabApp": LAB_CONFIG})
    requests.put(
        f"{server.url}api/contents/notes.txt",
        headers={"Authorization": f"token {server.token}"},
        json={"type": "file", "format": "text", "content": "keep me"},
        timeout=30,
    ).raise_for_status()
    page = open_lab(browser, server, "notes.txt")

    status = page.get_by_test_id("gputap-status")
    expect(status).to_have_text(
        re.compile(r"^A100-80GB 1g\.10gb slice · 87% · 1\.14\d{4} credits$")
    )
    # billing's warning: a notification, once
    toast = page.locator(".Toastify__toast", has_text="About 25 min of credit")
    expect(toast).to_have_count(1)
    toast.locator(".jp-Notification-Toast-Close").click()  # it covers the panel's foot

    status.click()
    panel = page.get_by_test_id("gputap-panel")
    expect(panel).to_be_visible()
    expect(page.get_by_test_id("gputap-card")).to_have_text("A100-80GB 1g.10gb slice")
    expect(page.get_by_test_id("gputap-gpu-utilization")).to_contain_text("87 %")
    expect(page.get_by_test_id("gputap-gpu-memory")).to_contain_text("30.0 GiB / 80.0 GiB")
    expect(page.get_by_test_id("gputap-gpu-plot")).to_be_visible()
    expect(page.get_by_test_id("gputap-price")).to_contain_text("1.142857 credits/h")
    expect(page.get_by_test_id("gputap-balance")).to_contain_text("8.857143 credits")
    expect(page.get_by_test_id("gputap-time-left")).to_contain_text("7 h 4")
    expect(page.get_by_test_id("gputap-warning")).to_have_text(WARNING)
    cost = page.get_by_test_id("gputap-cost-so-far")
    before = cost.inner_text()
    expect(cost).not_to_have_text(before, timeout=5_000)  # ticks every second

    # disks: a bad name is refused in the page, the price shows before creating
    page.get_by_test_id("gputap-disk-name").fill("Bad Name")
    page.get_by_test_id("gputap-disk-create").click()
    expect(page.get_by_test_id("gputap-disk-message")).to_contain_text("1 to 32 of a-z")
    page.get_by_test_id("gputap-disk-name").fill("scratch")
    page.get_by_test_id("gputap-disk-size").fill("20")
    expect(page.get_by_test_id("gputap-disk-price")).to_contain_text("20 GB: 0.0028 credits/h")
    assert not [s for s in state.seen if s.method == "POST"]
    page.get_by_test_id("gputap-disk-create").click()
    expect(page.get_by_test_id("gputap-disk-scratch")).to_contain_text("not attached")
    page.get_by_test_id("gputap-disk-delete-scratch").click()
    page.locator(".jp-Dialog-button.jp-mod-warn").click()
    expect(page.get_by_test_id("gputap-disk-scratch")).to_have_count(0)
    assert [(s.method, s.path) for s in state.seen if s.method != "GET"] == [
        ("POST", "/hub/gputap/api/users/alice/disks"),
        ("DELETE", "/hub/gputap/api/users/alice/disks/scratch"),
    ]

    # change to a sold-out card: confirm, told it is sold out, wait in the queue
    select = page.get_by_test_id("gputap-change-select")
    expect(select.locator("option[data-key='H100-80GB']")).to_have_text(
        "H100-80GB · sold out · 9.00 credits/h"
    )
    select.select_option(select.locator("option[data-key='H100-80GB']").get_attribute("value"))
    page.get_by_test_id("gputap-change-button").click()
    expect(page.get_by_test_id("gputap-confirm")).to_contain_text("running kernels stop")
    expect(page.get_by_test_id("gputap-confirm")).to_contain_text("It is sold out now")
    page.locator(".jp-Dialog-button.jp-mod-warn").click()
    expect(page.get_by_test_id("gputap-sold-out")).to_contain_text("No free H100-80GB now")
    expect(page.get_by_test_id("gputap-sold-out")).not_to_contain_text("undefined")
    expect(page.get_by_test_id("gputap-sold-out")).to_contain_text("CPU only")
    page.locator(".jp-Dialog-button.jp-mod-warn", has_text="Wait in queue").click()
    expect(page.get_by_test_id("gputap-progress")).to_contain_text("Waiting in the queue")
    changes = [s.body for s in state.seen if s.path.endswith("/change") and s.method == "POST"]
    options = {"kind": "card", "card": "H100-80GB", "count": 1}
    assert changes == [{"options": options, "queue": False}, {"options": options, "queue": True}]
    # the workspace was written to the server before the hub was asked
    workspace = server.get("lab/api/workspaces/default").json()
    assert "editor:notes.txt" in str(workspace["data"])

    state.change = {**state.change, "state": "done", "message": "Now on H100-80GB."}
    expect(page.locator(".jp-toast-message", has_text="Now on H100-80GB.")).to_be_visible(
        timeout=30_000
    )
    # reloaded on the same workspace: the document and the panel are back
    expect(page.locator(".lm-DockPanel-tabBar")).to_contain_text("notes.txt")
    expect(page.get_by_test_id("gputap-panel")).to_be_visible()
    # and the warning is not shown a second time
    time.sleep(1)
    expect(page.locator(".jp-toast-message", has_text="About 25 min of credit")).to_have_count(0)
    page.close()


def test_simulated_card(browser, lab_server, fresh_hub):  # noqa: F811
    state, url = fresh_hub
    server = lab_server("BusyGPU", env=hub_env(state, url), config={"LabApp": LAB_CONFIG})
    page = open_lab(browser, server)
    status = page.get_by_test_id("gputap-status")
    expect(status).to_have_text(re.compile(r"^A100-80GB 1g\.10gb slice · simulated · "))
    status.click()
    expect(page.get_by_test_id("gputap-gpu-simulated")).to_have_text(
        "simulated card: no live numbers"
    )
    expect(page.get_by_test_id("gputap-simulated-tag")).to_be_visible()
    expect(page.get_by_test_id("gputap-gpu-utilization")).to_have_count(0)
    page.close()


def test_slice_activity_and_a_device_error(browser, lab_server, fresh_hub):  # noqa: F811
    state, url = fresh_hub
    state.simulated = False
    env = hub_env(state, url) | {"GPUTAP_SIMULATED": "0"}
    server = lab_server("HopperSlices", env=env, config={"LabApp": LAB_CONFIG})
    page = open_lab(browser, server)
    page.get_by_test_id("gputap-status").click()
    slices = page.get_by_test_id("gputap-device-mig")
    expect(slices).to_have_count(2)
    expect(slices.nth(0).get_by_test_id("gputap-gpu-utilization")).to_contain_text("42 %")
    expect(slices.nth(0).get_by_test_id("gputap-gpu-processes")).to_have_count(0)
    expect(slices.nth(1).get_by_test_id("gputap-gpu-utilization")).to_have_count(0)
    expect(slices.nth(1).get_by_test_id("gputap-gpu-memory")).to_contain_text("?")
    expect(slices.nth(1).get_by_test_id("gputap-gpu-error")).to_have_text("memory: GPU is lost")
    page.close()
