"""Pods whose user is not root run this checkout's Python wherever the checkout lies, as on a
fresh machine: there the root user's home is mode 0700, and a clone inside it is closed to
every other user (issue 26). The pod-user tests run again from a copy of the checkout's view
behind a folder only root may enter (a bind mount in a throwaway mount namespace), with its
own virtualenv: each must pass there too."""

import os
import subprocess
import sys
import tempfile
from pathlib import Path

#: this checkout
CHECKOUT = Path(__file__).resolve().parents[2]

#: tests whose pods run the virtualenv's python as a user other than root
POD_USER_TESTS = [
    "tests/kube_sim/test_volumes.py::test_a_fresh_volume_is_owned_by_root_so_the_images_user_cannot_write_it",
    "tests/kube_sim/test_volumes.py::test_fs_group_makes_the_volume_the_pods_group_and_writable",
    "tests/helm/test_hub_pod.py::test_a_container_runs_as_its_user_and_its_volumes_are_its_fs_groups",
]


def test_non_root_pods_run_a_checkout_that_lies_behind_a_closed_folder():
    # beside the tests' own temporary folders, not among them: /root on a fresh machine
    with tempfile.TemporaryDirectory(prefix="gputap-closed-") as folder:
        closed = Path(folder)
        assert closed.stat().st_mode & 0o777 == 0o700
        run = run_behind(closed)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert f"{len(POD_USER_TESTS)} passed" in run.stdout


def run_behind(closed: Path) -> subprocess.CompletedProcess:
    """The pod-user tests, run from this checkout as seen at ``closed``/main."""
    view = closed / "main"
    view.mkdir()
    venv = Path(sys.prefix).relative_to(CHECKOUT)  # the virtualenv this run uses
    python = view / venv / "bin" / "python"
    script = 'mount --bind "$1" "$2" && cd "$2" && shift 2 && exec "$@"'
    return subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh"]
        + [str(CHECKOUT), str(view), str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider"]
        + POD_USER_TESTS,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTEST_ADDOPTS": ""},
    )
