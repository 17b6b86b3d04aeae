"""Moving a user's account to another name (a renamed GitHub login): what a backend answers.

A backend that can move a user's files gives its spawner the coroutine
``move_user_files(old, new)`` (the local backend: ``spawner/local/moves.py``). It moves the
home and the data disks of ``old`` to ``new``'s names, or refuses with :class:`MoveRefused`
before moving anything, and returns a coroutine function that moves them back. A backend
without it cannot move accounts; the hub's move handler (``spawner/api/admin.py``) says so.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

#: what ``move_user_files`` returns: moves the files back (the move failed further on)
UndoMove = Callable[[], Awaitable[None]]


class MoveRefused(Exception):
    """The files cannot move, said for the admin: what is in the way and what to do."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message
