"""The service's routes: every resource module's ``default_handlers``, in one explicit order,
under the service prefix."""

from __future__ import annotations

from typing import Any

from tornado import web

from . import accounts, admin, courses, pages, prices, sessions
from .base import BaseHandler

#: the modules whose routes make the service, in the order tornado tries them. Tornado takes
#: the first route that matches, and matches each one whole (it anchors the pattern), so only
#: routes whose patterns share paths depend on the order: within a module, listed first (see
#: courses: ``api/courses/join`` before ``api/courses/([^/]+)``); across modules, none.
#: The pages come last, the user's page (the prefix itself) at their end.
MODULES = (admin, accounts, sessions, prices, courses, pages)


def make_handlers(prefix: str, kwargs: dict[str, Any]) -> list[tuple]:
    """Routes under the service prefix (which ends in "/"). Billing's own handlers get
    ``kwargs`` (the store, the database executor, the configuration); tornado's and the
    hub's (health, the OAuth callback) take none."""
    routes: list[tuple] = []
    for module in MODULES:
        for path, handler, *extra in module.default_handlers:
            if issubclass(handler, BaseHandler):
                routes.append((prefix + path, handler, {**kwargs, **(extra[0] if extra else {})}))
            else:
                routes.append((prefix + path, handler, *extra))
    if prefix != "/":
        routes.append((prefix.rstrip("/"), web.RedirectHandler, {"url": prefix}))
    return routes
