"""``%gputap_run``: gputap.run from a line of IPython.

    %gputap_run train.py --epochs 3
    %gputap_run --workers 2 --gpus 1 --max-restarts 1 train.py --epochs 3

Options before the script are gputap's; everything from the script on is the script's.
"""

from __future__ import annotations

import argparse
import shlex

from .group import GroupError
from .launch import RunFailed, run


def parse(line: str) -> tuple[argparse.Namespace, list[str]]:
    """The magic's options and the script with its arguments; ValueError saying what is
    wrong."""
    parser = argparse.ArgumentParser(prog="%gputap_run", add_help=False, exit_on_error=False)
    parser.add_argument("--workers", type=int)
    parser.add_argument("--gpus", type=int)
    parser.add_argument("--nproc-per-node", type=int)
    parser.add_argument("--max-restarts", type=int, default=0)
    parser.add_argument("script")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    try:
        options = parser.parse_args(shlex.split(line))
    except (argparse.ArgumentError, SystemExit) as e:
        raise ValueError(
            "usage: %gputap_run [--workers N] [--gpus G] [--nproc-per-node P] "
            f"[--max-restarts R] SCRIPT [ARGS...] ({e})"
        ) from None
    return options, list(options.args)


def gputap_run(line: str) -> None:
    try:
        options, args = parse(line)
    except ValueError as e:
        print(e)
        return
    try:
        run(
            options.script,
            *args,
            workers=options.workers,
            gpus=options.gpus,
            nproc_per_node=options.nproc_per_node,
            max_restarts=options.max_restarts,
        )
    except (GroupError, RunFailed) as e:
        print(f"gputap: {e}")


def register(ipython) -> None:
    ipython.register_magic_function(gputap_run, "line", "gputap_run")
