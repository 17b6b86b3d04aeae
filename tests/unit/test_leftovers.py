"""What is left of a server, found by its start's mark (spawner/local/leftovers.py)."""

import os
import subprocess
import sys
import uuid

from spawner.local.leftovers import MARK, end_marked, marked, marked_processes


def test_the_mark_matches_a_whole_entry_only():
    environ = b"PATH=/bin\0GPUTAP_START=abc\0HOME=/h\0"
    assert marked("abc", environ)
    assert not marked("ab", environ)
    assert not marked("abc", b"X_GPUTAP_START=abc\0")
    assert not marked("abc", b"GPUTAP_START=abcd\0")


def test_processes_of_a_start_are_ended_and_no_other():
    mark, other = uuid.uuid4().hex, uuid.uuid4().hex
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    ours = [subprocess.Popen(sleeper, env={**os.environ, MARK: mark}) for _ in range(2)]
    theirs = subprocess.Popen(sleeper, env={**os.environ, MARK: other})
    try:
        assert sorted(marked_processes(mark)) == sorted(p.pid for p in ours)
        assert end_marked(mark) == []
        assert all(p.wait(5) == -9 for p in ours)
        assert theirs.poll() is None
        assert marked_processes("") == []
    finally:
        for p in [*ours, theirs]:
            p.kill()
            p.wait()
