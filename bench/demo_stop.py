"""How long Ctrl-C takes to stop `make demo`: the demo, the hub, the proxy, billing and the
idle culler all gone, started from a terminal and from a script (whose background job has
SIGINT ignored, kept across exec).

Each way the demo starts in a process group of its own, as a terminal's foreground job; once
it says it runs, the whole group gets SIGINT, as Ctrl-C sends it. Target (issue 27): every
stop within 5 s.

    .venv/bin/python bench/demo_stop.py [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.integration.test_hub_death import none_left, running_demo  # noqa: E402
from tests.platform import Platform  # noqa: E402

TARGET_SECONDS = 5.0


def stop_seconds(platform: Platform, from_script: bool) -> float:
    """Start the demo, press Ctrl-C once it runs, and time until nothing of it is left."""
    with running_demo(platform, own_group=True, from_script=from_script) as demo:
        pressed = time.monotonic()
        os.killpg(demo.pid, signal.SIGINT)
        while not none_left(platform):
            if time.monotonic() - pressed > 120:
                raise SystemExit("the demo still runs 120 s after Ctrl-C")
            time.sleep(0.05)
        return time.monotonic() - pressed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    worst = 0.0
    for from_script in (False, True):
        where = "a script" if from_script else "a terminal"
        for _ in range(args.runs):
            platform = Platform(Path(tempfile.mkdtemp(prefix="gputap-demo-stop-")))
            seconds = stop_seconds(platform, from_script)
            worst = max(worst, seconds)
            print(f"Ctrl-C from {where}: everything stopped in {seconds:.2f} s")
    met = "met" if worst <= TARGET_SECONDS else "not met"
    print(f"target every stop within {TARGET_SECONDS:.0f} s (worst {worst:.2f} s): {met}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
