"""How a section function becomes a :class:`~billing_service.store.Store` method.

A section marks each function of a database session that is an operation of the store where
it defines it: ``@reads`` (a session of its own, writing nothing) or ``@writes`` (one write
transaction, run again when a concurrent writer took its key), with ``name=`` where the
method is called otherwise. ``@operations(section, ...)`` on the store's class makes each
marked function a method with the function's docstring and signature, less the database
session and the store's :class:`~.terms.Terms` (the store passes those), so each operation
is declared once.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from types import ModuleType
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])
C = TypeVar("C", bound=type)

#: the attribute a mark leaves on a section function: (method name, runner)
MARK = "__store_operation__"
#: the parameters the store fills in, not its callers
STORE_PARAMETERS = ("db", "terms")
#: how the store runs a read and a write (its methods of these names)
READ, WRITE = "_read", "_run"


def _marker(runner: str) -> Callable[..., Any]:
    def mark(work: F | None = None, *, name: str | None = None) -> Any:
        def marked(fn: F) -> F:
            setattr(fn, MARK, (name or fn.__name__, runner))
            return fn

        return marked(work) if work is not None else marked

    return mark


#: ``@reads`` or ``@reads(name="...")``: an operation that writes nothing
reads = _marker(READ)
#: ``@writes`` or ``@writes(name="...")``: an operation in one write transaction
writes = _marker(WRITE)


def method(work: Callable[..., Any], runner: str, name: str | None = None) -> Callable[..., Any]:
    """A store method that runs ``work(db, ...)`` with the store's ``runner`` (READ or WRITE)
    and, when ``work`` takes them, the store's ``terms``; named ``name`` (``work``'s own
    name when None), with ``work``'s docstring and signature less ``db`` and ``terms``."""
    signature = inspect.signature(work)
    takes_terms = "terms" in signature.parameters

    @functools.wraps(work)
    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        if takes_terms:
            kwargs["terms"] = self._terms
        return getattr(self, runner)(work, *args, **kwargs)

    parameters = [p for key, p in signature.parameters.items() if key not in STORE_PARAMETERS]
    this = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    run.__signature__ = signature.replace(parameters=[this, *parameters])
    run.__name__ = name or work.__name__
    return run


def operations(*sections: ModuleType) -> Callable[[C], C]:
    """Class decorator: every function the ``sections`` define and mark becomes a method of
    the class (``TypeError`` when the class has one of that name already)."""

    def adopt(cls: C) -> C:
        for section in sections:
            for work in vars(section).values():
                mark = getattr(work, MARK, None)
                if mark is None or work.__module__ != section.__name__:
                    continue
                name, runner = mark
                if name in vars(cls):
                    raise TypeError(f"{cls.__name__}.{name} is defined twice")
                run = method(work, runner, name)
                run.__qualname__ = f"{cls.__name__}.{name}"
                run.__module__ = cls.__module__
                setattr(cls, name, run)
        return cls

    return adopt
