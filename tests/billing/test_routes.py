"""Which handler answers which path: the route list is put together from the resource modules'
``default_handlers``, and tornado takes the first route that matches a path whole."""

import pytest
from tornado import httputil, web

from billing_service.handlers.routes import make_handlers

PREFIX = "/services/billing/"

ANSWERS = {
    "": "PageHandler",
    "admin": "AdminPageHandler",
    "courses": "CoursesPageHandler",
    "metrics": "MetricsHandler",
    "health": "HealthHandler",
    "oauth_callback": "HubOAuthCallbackHandler",
    "api/openapi.json": "OpenAPIHandler",
    "api/prices": "PricesHandler",
    "api/price-books": "PriceBooksHandler",
    "api/me": "MeHandler",
    "api/accounts": "AccountsHandler",
    "api/accounts/ada": "AccountHandler",
    "api/accounts/ada/courses": "StudentCoursesHandler",
    "api/accounts/ada/grants": "GrantsHandler",
    "api/accounts/ada/adjustments": "AdjustmentsHandler",
    "api/accounts/ada/transactions": "TransactionsHandler",
    "api/accounts/ada/holds": "HoldsHandler",
    "api/admission": "AdmissionHandler",
    "api/sessions": "SessionsHandler",
    "api/sessions/s1/stop": "SessionStopHandler",
    "api/holds/h1": "HoldHandler",
    "api/usage": "UsageHandler",
    "api/usage.csv": "UsageCSVHandler",
    "api/ledger/check": "LedgerCheckHandler",
    "api/courses": "CoursesHandler",
    # a course may not be named "join": the join route comes first
    "api/courses/join": "JoinHandler",
    "api/courses/dl101": "CourseDetailHandler",
    "api/courses/dl101/archive": "ArchiveHandler",
    "api/courses/dl101/students": "StudentsHandler",
    "api/courses/dl101/grants": "CourseGrantsHandler",
    "api/courses/dl101/usage": "RosterUsageHandler",
    "api/courses/dl101/usage.csv": "RosterUsageCSVHandler",
    "api/courses/dl101/enrollment": "EnrollmentHandler",
    "api/instructors/ada": "InstructorsHandler",
}


def answering(path: str) -> str | None:
    app = web.Application(make_handlers(PREFIX, {}))
    line = httputil.RequestStartLine("GET", PREFIX + path, "HTTP/1.1")
    headers = httputil.HTTPHeaders({"Host": "127.0.0.1"})
    request = httputil.HTTPServerRequest(start_line=line, headers=headers)
    delegate = app.find_handler(request)
    handler = getattr(delegate, "handler_class", None)
    return None if handler is None or handler is web.ErrorHandler else handler.__name__


@pytest.mark.parametrize(("path", "handler"), sorted(ANSWERS.items()))
def test_each_path_has_its_handler(path, handler):
    assert answering(path) == handler


@pytest.mark.parametrize("path", ["api/usage.csvx", "api/accounts/ada/x", "api/courses/a/b/c", "x"])
def test_other_paths_are_not_found(path):
    assert answering(path) is None


def test_the_prefix_without_its_slash_redirects():
    routes = make_handlers(PREFIX, {})
    assert routes[-1] == ("/services/billing", web.RedirectHandler, {"url": PREFIX})
