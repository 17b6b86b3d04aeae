"""The whole way through the hub, in Chromium: JupyterLab with the gputap panel on a simulated
slice, a change of GPU that keeps the files and the open notebook, exact billing of both
sessions, and a data disk whose file survives a second change (docs/lab.md)."""

from __future__ import annotations

import json
import re
import time
from datetime import datetime
from decimal import Decimal

from playwright.sync_api import Page, expect

from tests.browser.shots import screenshot

NOTEBOOK = {
    "cells": [
        {
            "cell_type": "code",
            "execution_count": None,
            "id": "a1",
            "metadata": {},
            "outputs": [],
            "source": "print('still here')",
        }
    ],
    "metadata": {
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}
    },
    "nbformat": 4,
    "nbformat_minor": 5,
}


def log_in(page: Page, url: str, name: str) -> None:
    page.goto(f"{url}/hub/login")
    page.fill("#username_input", name)
    page.fill("#password_input", "anything")
    page.click("#login_submit")
    page.wait_for_url(lambda url: "/hub/login" not in url)


def open_panel(page: Page) -> None:
    status = page.get_by_test_id("gputap-status")
    expect(status).to_be_visible(timeout=90_000)
    if not page.get_by_test_id("gputap-panel").is_visible():
        status.click()
    expect(page.get_by_test_id("gputap-panel")).to_be_visible()


def change_to(page: Page, key: str) -> None:
    select = page.get_by_test_id("gputap-change-select")
    option = select.locator(f"option[data-key='{key}']")
    expect(option).to_have_count(1, timeout=30_000)
    select.select_option(option.get_attribute("value"))
    page.get_by_test_id("gputap-change-button").click()
    expect(page.get_by_test_id("gputap-confirm")).to_contain_text("running kernels stop")
    confirm_and_wait_for_reload(page)


def confirm_and_wait_for_reload(page: Page) -> None:
    """Confirm a restart (change or disk) and wait until Lab has reloaded by itself on the
    restarted server."""
    # a new document's load event: Lab's own URL changes (history.pushState) do not count
    with page.expect_event("load", timeout=180_000):
        page.locator(".jp-Dialog-button.jp-mod-warn").click()
    open_panel(page)


def contents(page: Page, base: str, path: str) -> dict:
    """A file through the server's contents API, as Lab reads it (same origin, cookies)."""
    return page.evaluate(
        """async ([base, path]) => {
            const xsrf = document.cookie.split('; ').find(c => c.startsWith('_xsrf='));
            const r = await fetch(base + 'api/contents/' + path + '?content=1', {
                headers: {'X-XSRFToken': xsrf ? decodeURIComponent(xsrf.slice(6)) : ''},
            });
            return {status: r.status, body: r.ok ? await r.json() : null};
        }""",
        [base, path],
    )


def put_text(page: Page, base: str, path: str, text: str) -> int:
    return page.evaluate(
        """async ([base, path, text]) => {
            const xsrf = document.cookie.split('; ').find(c => c.startsWith('_xsrf='));
            const r = await fetch(base + 'api/contents/' + path, {
                method: 'PUT',
                headers: {'Content-Type': 'application/json',
                          'X-XSRFToken': xsrf ? decodeURIComponent(xsrf.slice(6)) : ''},
                body: JSON.stringify({type: 'file', format: 'text', content: text}),
            });
            return r.status;
        }""",
        [base, path, text],
    )


def test_panel_change_gpu_keeps_work_and_bills_exact_seconds(platform, browser, tmp_path):
    name = "lena"
    platform.create_user(name)
    home = platform.root / "data" / "homes" / name
    home.mkdir(parents=True, exist_ok=True)
    (home / "analysis.ipynb").write_text(json.dumps(NOTEBOOK))
    slice_ = {"kind": "slice", "card": "A100-80GB", "profile": "1g.10gb"}
    assert platform.spawn(name, slice_).status_code in (201, 202)
    platform.wait_ready(name)

    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.set_default_timeout(90_000)
    log_in(page, platform.url, name)
    base = f"{platform.url}/user/{name}/"
    page.goto(f"{base}lab/tree/analysis.ipynb")
    expect(page.locator(".lm-DockPanel-tabBar")).to_contain_text("analysis.ipynb")

    # see: the card (simulated, so no numbers) and the cost ticking
    open_panel(page)
    expect(page.get_by_test_id("gputap-card")).to_contain_text("A100-80GB 1g.10gb")
    # how long this start took, as the hub measured it
    ready = page.get_by_test_id("gputap-time-to-ready")
    expect(ready).to_have_text(re.compile(r"Ready \d+\.\d+ s after Start"))
    first_ready = ready.inner_text()
    expect(page.get_by_test_id("gputap-gpu-simulated")).to_be_visible()
    expect(page.get_by_test_id("gputap-gpu-utilization")).to_have_count(0)
    cost = page.get_by_test_id("gputap-cost-so-far")
    expect(cost).to_contain_text("credits")
    before = cost.inner_text()
    expect(cost).not_to_have_text(before, timeout=10_000)
    screenshot(page, "lab-panel.png")

    # change: slice -> a whole RTX-4090; Lab comes back by itself on the new server
    first_pid = platform.server(name)["state"]["pid"]
    change_to(page, "RTX-4090")
    expect(page.get_by_test_id("gputap-card")).to_contain_text("RTX-4090", timeout=120_000)
    assert platform.server(name)["state"]["pid"] != first_pid
    assert platform.server_env(name)["GPUTAP_OFFERING"] == "RTX-4090"
    # the new server's own start, measured anew
    expect(ready).to_have_text(re.compile(r"Ready \d+\.\d+ s after Start"))
    expect(ready).not_to_have_text(first_ready)
    # same files, same open notebook (the workspace came back)
    expect(page.locator(".lm-DockPanel-tabBar")).to_contain_text("analysis.ipynb")
    assert contents(page, base, "analysis.ipynb")["status"] == 200

    # billing: two sessions, the old one ended, each billed its exact whole seconds
    page.goto(f"{platform.url}/services/billing/")
    sessions = sorted(platform.sessions(name), key=lambda s: s["started_at"])
    assert [s["sku"] for s in sessions] == ["A100-80GB/1g.10gb", "RTX-4090"]
    old, new = sessions
    assert old["state"] == "ended" and new["state"] == "running"
    exact = datetime.fromisoformat(old["ended_at"]) - datetime.fromisoformat(old["started_at"])
    assert old["billed_seconds"] == int(exact.total_seconds())
    assert datetime.fromisoformat(new["started_at"]) >= datetime.fromisoformat(old["ended_at"])
    ended = page.locator(f'#sessions tr.session[data-id="{old["id"]}"]')
    expect(ended.locator("td.seconds")).to_have_text(str(old["billed_seconds"]))
    expect(page.locator(f'#running tr.running-session[data-id="{new["id"]}"]')).to_contain_text(
        "RTX-4090"
    )
    assert platform.ledger_problems() == []
    page.close()


def test_disk_attached_in_lab_keeps_its_file_across_a_change_of_gpu(platform, browser):
    name = "dora"
    platform.create_user(name)
    assert platform.spawn(name, {"kind": "card", "card": "T4", "count": 1}).status_code in (
        201,
        202,
    )
    platform.wait_ready(name)
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.set_default_timeout(90_000)
    log_in(page, platform.url, name)
    base = f"{platform.url}/user/{name}/"
    page.goto(f"{base}lab")
    open_panel(page)

    # create: the price shows before creating; then attach (the server restarts)
    page.get_by_test_id("gputap-disk-name").fill("data")
    page.get_by_test_id("gputap-disk-size").fill("5")
    expect(page.get_by_test_id("gputap-disk-price")).to_contain_text("5 GB")
    page.get_by_test_id("gputap-disk-create").click()
    expect(page.get_by_test_id("gputap-disk-data")).to_contain_text("not attached")
    page.get_by_test_id("gputap-disk-attach-data").click()
    confirm_and_wait_for_reload(page)
    expect(page.get_by_test_id("gputap-disk-data")).to_contain_text("attached here")
    assert put_text(page, base, "disks/data/results.csv", "epoch,loss\n1,0.5\n") == 201
    folder = platform.root / "data" / "disks" / name / "data"
    assert (folder / "results.csv").read_text() == "epoch,loss\n1,0.5\n"

    # change the GPU again: the disk comes along, its file intact
    change_to(page, "cpu")
    expect(page.get_by_test_id("gputap-card")).to_contain_text("CPU", timeout=120_000)
    expect(page.get_by_test_id("gputap-disk-data")).to_contain_text("attached here")
    again = contents(page, base, "disks/data/results.csv")
    assert again["status"] == 200 and again["body"]["content"] == "epoch,loss\n1,0.5\n"
    [disk] = [s for s in platform.sessions(name) if s["sku"] == "disk"]
    assert disk["count"] == 5 and disk["state"] == "running"
    assert platform.ledger_problems() == []
    page.close()


def no_error_dialog(page: Page, seconds: float = 5) -> None:
    """No dialog (Lab's "File Load Error", "Cannot open", …) shows up for `seconds`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        dialogs = page.locator(".jp-Dialog")
        assert dialogs.count() == 0, dialogs.first.inner_text()
        time.sleep(0.25)


def test_detaching_the_disk_being_browsed_leaves_lab_in_a_folder_that_exists(platform, browser):
    name = "dirk"
    platform.create_user(name)
    assert platform.spawn(name, {"kind": "cpu"}).status_code in (201, 202)
    platform.wait_ready(name)
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.set_default_timeout(90_000)
    log_in(page, platform.url, name)
    base = f"{platform.url}/user/{name}/"
    page.goto(f"{base}lab")
    open_panel(page)
    page.get_by_test_id("gputap-disk-name").fill("scratch")
    page.get_by_test_id("gputap-disk-size").fill("1")
    page.get_by_test_id("gputap-disk-create").click()
    expect(page.get_by_test_id("gputap-disk-scratch")).to_contain_text("not attached")
    page.get_by_test_id("gputap-disk-attach-scratch").click()
    confirm_and_wait_for_reload(page)
    assert put_text(page, base, "disks/scratch/notes.txt", "on the disk\n") == 201

    # browse the disk: the file browser in ~/disks/scratch, a file of it open
    page.goto(f"{base}lab/tree/disks/scratch/notes.txt")
    # Lab takes a while to load on a busy machine (expect's own default is 5 s)
    expect(page.locator(".lm-DockPanel-tabBar")).to_contain_text("notes.txt", timeout=60_000)
    crumbs = page.locator("#filebrowser .jp-BreadCrumbs")
    expect(crumbs).to_contain_text("scratch", timeout=30_000)
    open_panel(page)
    page.get_by_test_id("gputap-disk-detach-scratch").click()
    confirm_and_wait_for_reload(page)
    expect(page.get_by_test_id("gputap-disk-scratch")).to_contain_text(
        "not attached", timeout=60_000
    )
    assert contents(page, base, "disks/scratch")["status"] == 404  # gone from the server

    # Lab is in a folder that exists, says nothing went wrong, and the disk's file is closed
    no_error_dialog(page)
    expect(crumbs).not_to_contain_text("scratch", timeout=30_000)
    expect(page.locator("#filebrowser .jp-DirListing-content")).to_be_visible()
    expect(page.locator(".lm-DockPanel-tabBar")).not_to_contain_text("notes.txt")
    assert "disks/scratch" not in page.url
    # the file is still on the disk (detached, not deleted)
    folder = platform.root / "data" / "disks" / name / "scratch"
    assert (folder / "notes.txt").read_text() == "on the disk\n"
    page.close()


def micro(text: str) -> int:
    """'9.998766 credits available' → 9998766."""
    return int(Decimal(text.split()[0]) * 1_000_000)


def test_lab_so_far_and_available_agree_with_billing_to_the_micro_credit(platform, browser):
    name = "sofi"
    platform.create_user(name)
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.set_default_timeout(90_000)
    log_in(page, platform.url, name)  # opens the account with its trial credit
    platform.adjust(name, "1.234567")  # paid credit beside the trial: both are own credit
    assert platform.spawn(name, {"kind": "cpu"}).status_code in (201, 202)
    platform.wait_ready(name)
    page.goto(f"{platform.url}/user/{name}/lab")
    open_panel(page)
    expect(page.get_by_test_id("gputap-cost-so-far")).to_contain_text("credits")

    readings = 0
    deadline = time.monotonic() + 25  # across syncs (every 10 s) and interval charges
    while time.monotonic() < deadline:
        before = platform.account(name)
        shown = page.evaluate(
            """() => ['gputap-cost-so-far', 'gputap-balance'].map(
                 (id) => document.querySelector(`[data-testid=${id}] .gputap-value`).textContent)"""
        )
        after = platform.account(name)
        so_far, available = micro(shown[0]), micro(shown[1])
        [b], [a] = before["running"], after["running"]
        # billing's own relation at each as_of: what the session cost plus what is
        # available is the own balance plus what the session's charges already took
        for view, session in ((before, b), (after, a)):
            own = view["credit"]
            assert own["available_micro"] + session["cost_micro"] == (
                own["balance_micro"] + session["charged_micro"]
            ), view
        balance_side = after["credit"]["balance_micro"] + a["charged_micro"]
        # the panel's two numbers, read at one moment, add up to the same
        assert so_far + available == balance_side, (shown, after)
        # and they are billing's numbers of one whole second the panel showed: it redraws
        # every second and counts from when billing's answer arrived (it left billing a
        # moment before), so it may show up to two seconds before the first read
        price = a["price_per_hour_micro"] * a["count"]
        seconds = range(b["billed_seconds"] - 2, a["billed_seconds"] + 1)
        assert so_far in {price * n // 3600 for n in seconds}, (so_far, seconds, shown)
        readings += 1
        time.sleep(0.37)
    assert readings > 20
    platform.stop_server(name)
    page.close()
