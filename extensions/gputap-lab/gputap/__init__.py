"""gputap from a notebook: scale out and run across the group (docs/scale-out.md).

    import gputap
    gputap.scale(2, gpus=1)            # two workers beside this server, ready when it returns
    gputap.run("train.py", "--epochs", "3")   # torchrun on the notebook and every worker
    gputap.stop_workers()

``gputap.run("train.py", workers=2)`` scales first when the group is not that size. In IPython
the magic does the same: ``%gputap_run --workers 2 train.py --epochs 3`` (loaded in every
gputap environment's kernels; elsewhere ``%load_ext gputap``).
"""

from __future__ import annotations

from .group import Group, GroupError, scale, stop_workers, workers
from .launch import RunFailed, RunResult, run

__all__ = [
    "Group",
    "GroupError",
    "RunFailed",
    "RunResult",
    "run",
    "scale",
    "stop_workers",
    "workers",
    "load_ipython_extension",
]


def load_ipython_extension(ipython) -> None:
    """``%gputap_run [--workers N] [--gpus G] [--max-restarts R] SCRIPT [ARGS...]``."""
    from .magic import register

    register(ipython)
