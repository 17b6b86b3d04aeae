"""The billing API against its own OpenAPI description (billing_service/openapi.yaml), served by
the running service: schemathesis generates requests for every operation, as the hub and as a
billing admin, and no answer may be a 5xx or stray from the description."""

import json
import re
import time
from collections import Counter
from datetime import UTC, datetime

import pytest
import requests
import schemathesis
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.generation.meta import negated_parameters
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from billing_service.handlers.admin import OPENAPI_YAML, openapi_json
from billing_service.handlers.routes import make_handlers

PREFIX = "/services/billing/"
#: routes that answer no JSON, left out of the description on purpose (docs/billing.md)
NOT_JSON = {"", "admin", "courses", "metrics", "oauth_callback"}
VERBS = {"get", "put", "post", "delete", "patch"}
#: generated requests per operation and caller: enough to reach every field's edges while
#: the file runs in about a minute
EXAMPLES = 30
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]
#: operations only the hub may call, and those only billing admins may call (operationId)
HUB_ONLY = {"openAccount", "admit", "releaseHold", "startSession", "stopSession"}
ADMIN_ONLY = {
    "publishPriceBook",
    "grant",
    "adjust",
    "checkLedger",
    # running courses: instructors and admins; the hub only reads them
    "createCourse",
    "editCourse",
    "makeInstructor",
    "archiveCourse",
    "listStudents",
    "addStudent",
    "grantExtraHours",
    "rosterUsage",
    "rosterUsageCsv",
}
#: for users only: services are refused
USERS_ONLY = {"getMe", "joinCourse", "setFallback"}
#: the course the fixture makes (its students are USERS), and one generated archives may end
COURSE, ARCHIVED = "oa-course", "oa-old"

#: accounts the fixture opens and funds, so generated requests also reach existing ones
USERS = ["oa-ada", "oa-bo"]
#: admissions go to their own account: generated sessions may spend the others' credit
ADMITTED = "oa-cy"
#: accounts generated moves take (with nothing running, so they may move), and the names
#: they move to
MOVERS = [f"oa-mover{i}" for i in range(10)]
MOVED = [f"oa-moved{i}" for i in range(10)]
#: sessions the fixture starts, and ids of sessions generated requests may start
SESSION_IDS = ["oa-s1", "oa-s2", "oa-s3"]
NEW_SESSION_IDS = [f"oa-new{i}" for i in range(6)]
STARTED = "2024-01-01T00:00:00+00:00"
#: times after STARTED, where sessions live (generated ones span the years 1 to 9999)
TIMES = st.datetimes(
    min_value=datetime(2024, 1, 1), max_value=datetime(2027, 1, 1), timezones=st.just(UTC)
).map(datetime.isoformat)
AMOUNTS = st.sampled_from(["0.000001", "1", "25.00", "999.999999"])


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"token {token}"}


@pytest.fixture(scope="module")
def hub_billing():
    # charges every second, so generated sessions are charged while the test runs; no
    # reconciliation (these users have no servers on the hub, it would close their sessions)
    return {"charge_interval_seconds": 1, "reconcile_interval_seconds": 3600}


@pytest.fixture(scope="module")
def document(hub):
    r = requests.get(hub.billing + "api/openapi.json", headers=auth(hub.hub_token), timeout=10)
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("application/json")
    return r.json()


@pytest.fixture(scope="module")
def billing_schema(hub):
    return schemathesis.openapi.from_url(
        hub.billing + "api/openapi.json", headers=auth(hub.hub_token), timeout=10
    )


@pytest.fixture(scope="module")
def known(hub):
    """Funded accounts, running sessions and a hold; the SKUs that have prices; the price
    book in force."""

    def call(token, method, path, body=None):
        r = requests.request(method, hub.billing + path, headers=auth(token), json=body, timeout=10)
        assert r.status_code in (200, 201), r.text
        return r.json()

    for name in MOVERS:
        call(hub.hub_token, "PUT", f"api/accounts/{name}")
    for name in [*USERS, ADMITTED]:
        call(hub.hub_token, "PUT", f"api/accounts/{name}")
        grant = {"kind": "topup", "amount": "1000000", "reason": "fuzz", "idempotency_key": name}
        call(hub.ops_token, "POST", f"api/accounts/{name}/grants", grant)
    for i, sid in enumerate(SESSION_IDS):
        start = {"id": sid, "username": USERS[i % 2], "server_name": "", "sku": "T4", "count": 1}
        call(hub.hub_token, "POST", "api/sessions", {**start, "started_at": STARTED})
    admission = {"username": ADMITTED, "sku": "A100-80GB", "count": 1}
    hold = call(hub.hub_token, "POST", "api/admission", admission)["hold_id"]
    for name in USERS:  # students an instructor adds are users of the hub
        hub.platform.create_user(name)
    for slug in (COURSE, ARCHIVED):
        course = {"name": slug, "slug": slug, "allowed": ["T4"]}
        call(hub.ops_token, "POST", "api/courses", course)
        for name in USERS:
            call(hub.ops_token, "POST", f"api/courses/{slug}/students", {"username": name})
    [book, *_] = call(hub.hub_token, "GET", "api/price-books")["price_books"]
    return {
        "skus": [*book["prices"], "A100-80GB/1g.10gb", "T4/shared"],
        "holds": [hold],
        "book": {k: book[k] for k in ("prices", "spot_discount_percent", "shared_percent")},
    }


def documented_path(route: str) -> str:
    """``api/accounts/([^/]+)/holds`` -> ``/api/accounts/{}/holds``: the shape of a path."""
    return "/" + re.sub(r"\([^)]*\)", "{}", route).replace("\\.", ".")


def test_the_description_is_valid_openapi_and_documents_every_route(document, billing_schema):
    billing_schema.validate()  # against the OpenAPI 3.0 meta-schema
    # served as written, with the service's own prefix as the server
    assert document == {
        **yaml.safe_load(OPENAPI_YAML.read_text()),
        "servers": [{"url": "/services/billing"}],
    }
    documented = {re.sub(r"\{[^}]*\}", "{}", path) for path in document["paths"]}
    routes = {
        route[0].removeprefix(PREFIX)
        for route in make_handlers(PREFIX, {})
        if route[0].startswith(PREFIX)
    }
    expected = {documented_path(r) for r in routes - NOT_JSON}
    assert expected - documented == set(), "routes missing from billing_service/openapi.yaml"
    assert documented - expected == set(), "described paths that no route serves"


def operations() -> list[tuple[str, str]]:
    """(method, path) of every described operation, from the package's own description."""
    paths = json.loads(openapi_json(PREFIX))["paths"]
    return [(verb.upper(), path) for path, item in paths.items() for verb in item if verb in VERBS]


@pytest.mark.parametrize("method, path", operations(), ids=lambda v: v)
def test_every_operation_but_health_needs_a_login(hub, document, method, path):
    operation = document["paths"][path][method.lower()]
    url = hub.billing + re.sub(r"\{[^}]*\}", "x", path).lstrip("/")
    body = {} if "requestBody" in operation else None
    r = requests.request(method, url, json=body, timeout=10)
    if operation.get("security") == []:
        assert r.status_code == 200
        return
    # whatever the verb, the refusal says what to send
    assert r.status_code == 403, r.text
    assert r.json()["status"] == 403 and "Authorization: token" in r.json()["message"]


def sends_no_token(case) -> bool:
    """A negative case that leaves out the Authorization header: the login test covers those."""
    return any(name == "Authorization" for name, _ in negated_parameters(case.meta))


def steer(case, draw, known) -> None:
    """Point most generated requests at what exists (accounts, priced SKUs, sessions and
    holds, recent times, sane amounts), so they get past the lookups into admission,
    metering and the ledger; the others go as generated."""
    if not draw(st.sampled_from([True, True, True, False])):
        return
    values = {
        "username": st.sampled_from([ADMITTED] if case.path == "/api/admission" else USERS),
        "sku": st.sampled_from(known["skus"]),
        "id": st.sampled_from(
            known["holds"] if case.path.startswith("/api/holds/") else SESSION_IDS + NEW_SESSION_IDS
        ),
        "started_at": TIMES,
        "ended_at": TIMES,
        "amount": AMOUNTS,
        "allowed": st.just(["T4"]),
        "timezone": st.sampled_from(["UTC", "Europe/Berlin"]),
        "github_team": st.just("acme:dl"),
        "reset_time": st.just("08:00"),
        # a book must price every SKU on sale: new prices for each, maybe one SKU more
        "prices": st.fixed_dictionaries(
            {sku: st.sampled_from(["0.50", "2.25", "8.00"]) for sku in known["book"]["prices"]},
            optional={"B200": st.just("12.00")},
        ),
    }
    if isinstance(case.path_parameters, dict) and "slug" in case.path_parameters:
        archive = case.path.endswith("/archive")
        case.path_parameters["slug"] = ARCHIVED if archive else COURSE
    for container in (case.path_parameters, case.body):
        if isinstance(container, dict):
            for key, strategy in values.items():
                if key in container:
                    container[key] = draw(strategy)
    if case.path.endswith("/move"):  # the others' accounts stay where the other tests look
        if isinstance(case.path_parameters, dict) and "username" in case.path_parameters:
            case.path_parameters["username"] = draw(st.sampled_from(MOVERS + MOVED))
        if isinstance(case.body, dict) and "to" in case.body:
            case.body["to"] = draw(st.sampled_from(MOVERS + MOVED))


def moving(case) -> str | None:
    """The mover a steered move takes, None for every other request."""
    if not case.path.endswith("/move") or not isinstance(case.path_parameters, dict):
        return None
    name = case.path_parameters.get("username")
    return name if name in MOVERS + MOVED else None


@pytest.mark.parametrize("caller", ["hub", "admin"])
@pytest.mark.parametrize("method, path", operations(), ids=lambda v: v)
def test_generated_requests_get_no_5xx_and_documented_answers(
    billing_schema, document, hub, known, caller, method, path
):
    """Valid and invalid requests alike: each side's validation runs where it may call, and
    where it may not, nothing it sends gets through."""
    operation_id = document["paths"][path][method.lower()]["operationId"]
    token = hub.hub_token if caller == "hub" else hub.ops_token
    operation = billing_schema[path][method]
    cases = operation.as_strategy(GenerationMode.POSITIVE)
    if list(operation.iter_parameters()) or operation.body:
        # invalid input too, where there is input (else only the token could be left out)
        invalid = operation.as_strategy(GenerationMode.NEGATIVE)
        cases = st.one_of(cases, invalid.filter(lambda case: not sends_no_token(case)))
    answers: Counter[int] = Counter()

    @given(case=cases, data=st.data())
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def run(case, data):
        steer(case, data.draw, known)
        mover = moving(case)
        if mover is not None:
            # a move onto an existing name discards that account: without reopening the one
            # that moves, the movers die out and every later move meets a 404
            opened = requests.put(
                hub.billing + f"api/accounts/{mover}", headers=auth(hub.hub_token), timeout=10
            )
            assert opened.status_code in (200, 201), opened.text
        response = case.call_and_validate(headers=auth(token), checks=CHECKS, timeout=10)
        answers[response.status_code] += 1

    try:
        run()
    finally:
        if operation_id == "publishPriceBook":  # the prices the other tests use
            restore = requests.post(
                hub.billing + "api/price-books",
                headers=auth(hub.ops_token),
                json=known["book"],
                timeout=10,
            )
            assert restore.status_code in (200, 201), restore.text
    refused = (
        operation_id in USERS_ONLY
        or (operation_id in HUB_ONLY and caller != "hub")
        or (operation_id in ADMIN_ONLY and caller != "admin")
    )
    succeeded = sum(n for status, n in answers.items() if status < 300)
    if refused:
        assert succeeded == 0, f"{caller} got through {operation_id}: {answers}"
    else:
        assert succeeded > 0, f"no generated request got through {operation_id}: {answers}"


def test_after_the_generated_requests_the_books_balance(hub):
    time.sleep(2)  # a charge pass or two over the generated sessions
    r = requests.get(hub.billing + "api/ledger/check", headers=auth(hub.ops_token), timeout=30)
    assert r.json() == {"ok": True, "problems": []}
    log = hub.log()
    assert "Traceback" not in log, log[max(log.index("Traceback") - 2000, 0) :]
