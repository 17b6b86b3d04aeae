"""A settings typo stops the hub and billing at start with one line an operator can act on
(the file, the key's path, what is wrong and what it must be) and a non-zero status, never a
Python traceback. Each runs as a process, as an operator starts it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "hub_config" / "jupyterhub_config.py"

#: (settings file, what its one line must say)
TYPOS = {
    "unknown-key": (
        "billing:\n  trial_credti: '5'\n",
        "billing.trial_credti is not a setting; did you mean billing.trial_credit?",
    ),
    "wrong-type": (
        "billing:\n  min_billable_seconds: five\n",
        "billing.min_billable_seconds must be a whole number >= 1, not 'five'",
    ),
}
COMMANDS = {
    "hub": [sys.executable, "-m", "jupyterhub", "-f", str(CONFIG)],
    "billing": [sys.executable, "-m", "billing_service"],
    "billing-upgrade-db": [sys.executable, "-m", "billing_service", "upgrade-db"],
}


def start(command: list[str], settings: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUTAP", "JUPYTERHUB"))}
    env.update(GPUTAP_SETTINGS=str(settings), PYTHONPATH=str(ROOT))
    return subprocess.run(
        command,
        cwd=settings.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("typo", sorted(TYPOS))
@pytest.mark.parametrize("program", sorted(COMMANDS))
def test_a_settings_typo_is_one_line_and_a_failed_start(tmp_path, program, typo):
    text, says = TYPOS[typo]
    settings = tmp_path / "gputap.yaml"
    settings.write_text(text)
    done = start(COMMANDS[program], settings)
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert "Traceback" not in output, output
    lines = [line for line in done.stderr.splitlines() if says in line]
    assert len(lines) == 1, output
    assert f"{settings}: {says}" in lines[0]
    assert lines[0].startswith("gputap settings"), lines[0]
