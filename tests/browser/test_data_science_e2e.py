"""The data-science environment the whole way through the hub, in Chromium (issue 16): picked on
the spawn form with a slice, a notebook imports torch and matplotlib and plots, the panel names
the environment and keeps it across a change of GPU; TensorBoard opened from Lab's launcher
shows a run torch.utils.tensorboard wrote in ~/runs; the user's own HTTP app on a port answers
at its proxy URL (shown in the panel); another user opens neither.

The environment is the one ``make setup`` builds (.venv-ds: PyTorch's CPU build, numpy, pandas,
matplotlib) and ``make demo`` offers (hub_config/environments.py)."""

from __future__ import annotations

import json
import re
import socket
import time

import pytest
from playwright.sync_api import Page, expect

from hub_config.environments import DATA_SCIENCE_DIR, DATA_SCIENCE_KEY, demo_environments
from tests.browser.test_lab_e2e import change_to, log_in, open_panel
from tests.platform import Platform, free_port

#: the notebook's cells: a plot with torch and matplotlib, then a run for TensorBoard, then
#: the user's own HTTP app on PORT (as http.server, in the background)
CELLS = [
    "import torch, matplotlib\n"
    "import matplotlib.pyplot as plt\n"
    "x = torch.linspace(0, 6.28, 50)\n"
    "plt.plot(x.numpy(), torch.sin(x).numpy())\n"
    "print('torch', torch.__version__, 'matplotlib', matplotlib.__version__)",
    "import os\n"
    "from torch.utils.tensorboard import SummaryWriter\n"
    "writer = SummaryWriter(os.path.expanduser('~/runs/first-run'))\n"
    "for step in range(5):\n"
    "    writer.add_scalar('loss', 1 / (step + 1), step)\n"
    "writer.close()\n"
    "print('run written')",
    "import subprocess, sys\n"
    "app = subprocess.Popen([sys.executable, '-m', 'http.server', 'PORT', '--bind', "
    "'127.0.0.1'], cwd=os.path.expanduser('~'))\n"
    "print('app started')",
]


def notebook(port: int) -> dict:
    return {
        "cells": [
            {
                "cell_type": "code",
                "execution_count": None,
                "id": f"c{i}",
                "metadata": {},
                "outputs": [],
                "source": source.replace("PORT", str(port)),
            }
            for i, source in enumerate(CELLS)
        ],  # fmt: skip
        "metadata": {
            "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }


@pytest.fixture(scope="module")
def platform(tmp_path_factory):
    if not (DATA_SCIENCE_DIR / "bin" / "jupyterhub-singleuser").exists():
        pytest.fail(f"{DATA_SCIENCE_DIR} is missing: `make setup` builds it")
    [(_, entry)] = demo_environments({}).items()
    p = Platform(
        tmp_path_factory.mktemp("data-science"),
        extra={"environments": {DATA_SCIENCE_KEY: json.loads(entry)}},
    )
    p.start()
    yield p
    p.shutdown()


def run_cell(page: Page, cell, indicator, tries: int = 4) -> None:
    """Run ``cell`` (Shift+Enter in its editor) once the kernel is idle. On a loaded machine
    Lab may show the kernel idle before its connection takes requests, and a run asked then is
    dropped (its prompt stays "[ ]:"): ask again, as a user would."""
    prompt = cell.locator(".jp-InputPrompt")
    for _ in range(tries):
        expect(indicator).to_have_attribute("data-status", "idle", timeout=180_000)
        cell.locator(".jp-InputArea-editor").click()
        page.keyboard.press("Shift+Enter")
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if prompt.inner_text().strip() not in ("[ ]:", ""):
                return  # running ([*]) or done ([1])
            time.sleep(0.5)
    raise AssertionError(f"the cell never ran: {prompt.inner_text()!r}")


def fetch_status(page: Page, url: str) -> int:
    return page.evaluate("async url => (await fetch(url, {redirect: 'follow'})).status", url)


def wait_listening(port: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.5)
    raise AssertionError(f"nothing listens on {port}")


def test_the_data_science_environment_runs_torch_plots_opens_tensorboard_and_own_apps(
    platform, browser
):
    name, port = "tess", free_port()
    platform.create_user(name)
    home = platform.root / "data" / "homes" / name
    home.mkdir(parents=True, exist_ok=True)
    (home / "first.ipynb").write_text(json.dumps(notebook(port)))
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.set_default_timeout(120_000)
    log_in(page, platform.url, name)

    # the spawn form: the data-science environment and a slice
    page.goto(f"{platform.url}/hub/spawn")
    picker = page.locator("#gputap-environments")
    expect(picker).to_contain_text("Data science (PyTorch 2.13 CPU)")
    picker.locator(f'input[value="{DATA_SCIENCE_KEY}"]').check()
    page.locator('input[value="slice:A100-80GB/1g.10gb"]').check()
    page.locator('input[type="submit"], button[type="submit"]').last.click()
    page.wait_for_url(re.compile(rf"/user/{name}/lab"))
    assert platform.server_env(name)["GPUTAP_ENVIRONMENT"] == DATA_SCIENCE_KEY

    # the panel names it
    open_panel(page)
    expect(page.get_by_test_id("gputap-environment")).to_contain_text(
        "Data science (PyTorch 2.13 CPU)"
    )
    expect(page.get_by_test_id("gputap-card")).to_contain_text("A100-80GB 1g.10gb")

    # the notebook: import torch and matplotlib, plot; write a run; start an app
    base = f"{platform.url}/user/{name}/"
    page.goto(f"{base}lab/tree/first.ipynb")
    cells = page.locator(".jp-Notebook .jp-CodeCell")
    expect(cells).to_have_count(3)
    indicator = page.locator(".jp-Notebook-ExecutionIndicator").first
    for i, done in enumerate(["torch 2.13.0", "run written", "app started"]):
        run_cell(page, cells.nth(i), indicator)
        expect(cells.nth(i).locator(".jp-OutputArea")).to_contain_text(done, timeout=180_000)
    expect(cells.nth(0).locator(".jp-OutputArea img")).to_have_count(1)  # the plot

    # TensorBoard from the launcher, through the hub's proxy, with the run
    page.locator('[data-command="launcher:create"]').first.click()  # a new launcher tab
    tile = page.locator(".jp-LauncherCard").filter(has_text="TensorBoard")
    expect(tile.first).to_be_visible()
    with page.expect_popup() as popup:
        tile.first.click()
    board = popup.value
    board.wait_for_load_state()
    assert f"/user/{name}/tensorboard" in board.url
    deadline = time.monotonic() + 60
    while (runs := board.evaluate("async () => (await fetch('data/runs')).json()")) != [
        "first-run"
    ]:
        assert time.monotonic() < deadline, runs
        time.sleep(1)
    expect(board.locator("tb-webapp")).to_have_count(1)
    board.close()

    # the user's own app answers at its proxy URL, which the panel shows
    wait_listening(port)
    open_panel(page)
    page.get_by_test_id("gputap-port").fill(str(port))
    shown = page.get_by_test_id("gputap-port-url")
    expect(shown).to_have_text(f"{base}proxy/{port}/")
    assert fetch_status(page, f"{base}proxy/{port}/") == 200
    expect(page.get_by_test_id("gputap-app-tensorboard")).to_be_visible()

    # another user opens neither
    other = browser.new_page()
    platform.create_user("ugo")
    log_in(other, platform.url, "ugo")
    for path in (f"proxy/{port}/", "tensorboard/data/runs"):
        response = other.goto(f"{base}{path}")
        assert response.status in (403, 404), (path, response.status)
    other.close()

    # a change of GPU keeps the environment
    change_to(page, "RTX-4090")
    expect(page.get_by_test_id("gputap-card")).to_contain_text("RTX-4090", timeout=180_000)
    expect(page.get_by_test_id("gputap-environment")).to_contain_text("Data science")
    assert platform.server_env(name)["GPUTAP_ENVIRONMENT"] == DATA_SCIENCE_KEY
    sessions = sorted(platform.sessions(name), key=lambda s: s["started_at"])
    assert [s["environment"] for s in sessions] == [DATA_SCIENCE_KEY, DATA_SCIENCE_KEY]
    page.close()
