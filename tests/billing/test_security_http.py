"""Security rules of the billing API through the real hub (docs/security.md): idempotency keys
scoped to their caller and target, bodies with only known keys, one decimal notation for
amounts, bounded bodies, price books that price what the platform sells, course refusals
that do not name a stranger's course, students the hub knows, SameSite cookies."""

import re

import pytest
import requests

from .hub import user


def grant(as_ops, username, key, amount="5", reason="top-up", **extra):
    body = {"kind": "topup", "amount": amount, "reason": reason, "idempotency_key": key}
    return as_ops("POST", f"api/accounts/{username}/grants", json={**body, **extra})


def test_a_grant_key_reused_for_another_account_never_answers_its_transaction(as_hub, as_ops):
    for name in ("idem-a", "idem-b"):
        assert as_hub("PUT", f"api/accounts/{name}").status_code in (200, 201)
    first = grant(as_ops, "idem-a", "shared-key-1", amount="7")
    assert first.status_code == 201, first.text
    r = grant(as_ops, "idem-b", "shared-key-1", amount="7")
    assert r.status_code == 409, r.text
    assert "idem-a" not in r.text and str(first.json()["id"]) not in r.text
    assert "idempotency_key" in r.json()["message"]
    # nothing moved for either
    assert as_ops("GET", "api/accounts/idem-b").json()["balance"] == "10.00"
    assert as_ops("GET", "api/accounts/idem-a").json()["balance"] == "17.00"


def test_the_same_grant_key_with_another_body_is_409_and_a_replay_is_200(as_hub, as_ops):
    as_hub("PUT", "api/accounts/idem-c")
    assert grant(as_ops, "idem-c", "c-1", amount="3").status_code == 201
    replay = grant(as_ops, "idem-c", "c-1", amount="3")
    assert replay.status_code == 200
    r = grant(as_ops, "idem-c", "c-1", amount="30")
    assert r.status_code == 409 and "different" in r.json()["message"], r.text
    assert as_ops("GET", "api/accounts/idem-c").json()["balance"] == "13.00"


def test_an_instructor_reusing_anothers_grant_key_gets_409_not_the_grant(hub, as_hub, as_ops):
    as_hub("PUT", "api/accounts/idem-d")
    assert grant(as_ops, "idem-d", "taken-key", amount="2").status_code == 201
    prof = user(hub, "idem-prof")
    assert as_ops("PUT", "api/instructors/idem-prof").status_code == 201
    course = prof("POST", "api/courses", json={"name": "Idem", "allowed": ["T4"]}).json()
    student = user(hub, "idem-stu")
    assert student("POST", "api/courses/join", json={"code": course["join_code"]}).ok
    r = prof(
        "POST",
        f"api/courses/{course['slug']}/grants",
        json={"username": "idem-stu", "hours": 1, "reason": "x", "idempotency_key": "taken-key"},
    )
    assert r.status_code == 409, r.text
    assert "idem-d" not in r.text


def test_the_same_admission_key_with_another_body_is_409(as_hub):
    body = {"username": "idem-e", "sku": "T4", "count": 1, "idempotency_key": "adm-e-1"}
    assert as_hub("POST", "api/admission", json=body).status_code == 200
    assert as_hub("POST", "api/admission", json=body).status_code == 200
    r = as_hub("POST", "api/admission", json={**body, "sku": "A100-80GB"})
    assert r.status_code == 409 and "different" in r.json()["message"], r.text


@pytest.mark.parametrize(
    "method, path, body",
    [
        ("POST", "api/admission", {"username": "u", "sku": "T4", "count": 1, "cuorse": "x"}),
        ("PUT", "api/accounts/keys-u", {"groups": [], "admin": True}),
        ("POST", "api/price-books", {"prices": {"cpu": "0.1"}, "discount": 5}),
        ("POST", "api/accounts/keys-u/grants", {"kind": "topup", "amount": "1", "x": 1}),
        ("POST", "api/courses", {"name": "K", "allowed": ["T4"], "weekly_hour": 3}),
    ],
)
def test_unknown_keys_in_a_body_are_refused_naming_them_and_the_allowed_ones(
    as_hub, as_ops, method, path, body
):
    caller = as_hub if "admission" in path or method == "PUT" else as_ops
    r = caller(method, path, json=body)
    assert r.status_code == 400, r.text
    message = r.json()["message"]
    unknown = sorted(set(body) - {"username", "sku", "count", "groups", "prices"})
    assert unknown[0] in message and "allowed" in message.lower(), message


@pytest.mark.parametrize("amount", ["1e3", "0x10", " 12", "12,5", "NaN", "Infinity", "+1", "1_0"])
def test_amounts_take_one_decimal_notation(as_hub, as_ops, amount):
    as_hub("PUT", "api/accounts/amounts")
    r = grant(as_ops, "amounts", f"amount-{amount}", amount=amount)
    assert r.status_code == 400 and "decimal" in r.json()["message"], r.text
    assert as_ops("GET", "api/accounts/amounts").json()["balance"] == "10.00"


def test_json_numbers_that_are_not_decimals_are_refused(hub, as_hub, as_ops):
    as_hub("PUT", "api/accounts/amounts2")
    for n, raw in enumerate(["NaN", "Infinity", "1e3"]):
        fields = f'"kind": "topup", "amount": {raw}, "reason": "r", "idempotency_key": "n{n}"'
        body = "{" + fields + "}"
        r = requests.post(
            hub.billing + "api/accounts/amounts2/grants",
            data=body,
            headers={**as_ops.headers, "Content-Type": "application/json"},
            timeout=10,
        )
        assert r.status_code == 400, (raw, r.text)
    for n, amount in enumerate(["12.5", 12.5]):
        assert grant(as_ops, "amounts2", f"ok-{n}", amount=amount).status_code == 201
    assert as_ops("GET", "api/accounts/amounts2").json()["balance"] == "35.00"


def test_a_huge_body_is_413_and_a_deep_one_400_neither_echoed(hub, as_hub):
    huge = {"username": "x" * 50, "sku": "T4", "count": 1, "pad": "A" * 2_000_000}
    r = as_hub("POST", "api/admission", json=huge)
    assert r.status_code == 413, r.status_code
    deep = "[" * 30_000 + "]" * 30_000
    r = requests.post(hub.billing + "api/admission", data=deep, headers=as_hub.headers, timeout=10)
    assert r.status_code == 400 and len(r.text) < 500, r.text[:200]
    assert "nested too deep (more than 32 levels" in r.json()["message"]
    # read without a recursion error, but no real body nests so deep
    deep_value = '{"username": ' + "[" * 900 + "]" * 900 + "}"
    r = requests.post(
        hub.billing + "api/admission", data=deep_value, headers=as_hub.headers, timeout=10
    )
    assert r.status_code == 400 and "nested too deep" in r.json()["message"], r.text[:200]
    long_sku = {"username": "deep-u", "sku": "S" * 5000, "count": 1}
    r = as_hub("POST", "api/admission", json=long_sku)
    assert 400 <= r.status_code < 500 and "S" * 100 not in r.text
    assert "S" * 100 not in hub.log()


def test_a_price_book_that_unprices_an_offering_is_refused_naming_it(as_ops, as_hub):
    current = as_hub("GET", "api/prices").json()["prices"]
    assert "T4" in current and "cpu" in current
    r = as_ops("POST", "api/price-books", json={"prices": {"cpu": "0.10"}})
    assert r.status_code == 409, r.text
    assert "T4" in r.json()["message"] and "A100-80GB" in r.json()["message"]
    assert as_hub("GET", "api/prices").json()["prices"] == current


@pytest.mark.parametrize("sku", ["T4\n", "x" * 101, "<b>T4</b>", "T4 ", "../etc"])
def test_price_book_names_are_bounded(as_ops, as_hub, sku):
    prices = {s: p["per_hour"] for s, p in as_hub("GET", "api/prices").json()["prices"].items()}
    r = as_ops("POST", "api/price-books", json={"prices": {**prices, sku: "1.00"}})
    assert r.status_code == 400, r.text
    assert sku not in r.text or len(sku) < 20


def test_a_course_refusal_reads_the_same_for_a_stranger_as_for_no_course(hub, as_hub, as_ops):
    prof = user(hub, "secret-prof")
    assert as_ops("PUT", "api/instructors/secret-prof").status_code == 201
    made = prof(
        "POST",
        "api/courses",
        json={"name": "Top Secret ML", "allowed": ["T4"], "slug": "secret-ml"},
    )
    assert made.status_code == 201, made.text
    answers = []
    for slug in ("secret-ml", "no-such-course"):
        body = {"username": "stranger", "sku": "T4", "count": 1, "course": slug}
        r = as_hub("POST", "api/admission", json=body)
        answers.append((r.status_code, r.json()["message"].replace(slug, "SLUG")))
    assert answers[0] == answers[1], answers
    assert "Top Secret" not in answers[0][1]


def test_instructors_cannot_enroll_names_the_hub_does_not_know(hub, as_ops):
    prof = user(hub, "roster-prof")
    assert as_ops("PUT", "api/instructors/roster-prof").status_code == 201
    course = prof("POST", "api/courses", json={"name": "Roster", "allowed": ["T4"]}).json()
    r = prof("POST", f"api/courses/{course['slug']}/students", json={"username": "ghost-9"})
    assert r.status_code == 404 and "ghost-9" in r.json()["message"], r.text
    assert as_ops("GET", "api/accounts/ghost-9").status_code == 404
    hub.platform.create_user("real-9")
    r = prof("POST", f"api/courses/{course['slug']}/students", json={"username": "real-9"})
    assert r.status_code == 201, r.text


def _login(hub, name: str) -> requests.Session:
    browser = requests.Session()
    page = browser.get(f"{hub.url}/hub/login", timeout=10)
    xsrf = re.search(r'name="_xsrf" value="([^"]+)"', page.text)
    data = {"username": name, "password": "x", **({"_xsrf": xsrf.group(1)} if xsrf else {})}
    r = browser.post(f"{hub.url}/hub/login", data=data, allow_redirects=False, timeout=10)
    assert r.status_code == 302, r.text[:300]
    return browser, r


def _set_cookies(response: requests.Response) -> list[str]:
    return [v for k, v in response.raw.headers.items() if k.lower() == "set-cookie"]


def test_every_cookie_the_hub_and_billing_set_is_samesite_lax(hub):
    browser, login = _login(hub, "cookie-user")
    cookies = _set_cookies(login)
    # the billing page's OAuth: its state cookie, then (at the callback) its login cookie
    r = browser.get(hub.billing, allow_redirects=False, timeout=10)
    cookies += _set_cookies(r)
    while r.is_redirect:
        r = browser.get(
            r.headers["Location"]
            if r.headers["Location"].startswith("http")
            else hub.url + r.headers["Location"],
            allow_redirects=False,
            timeout=10,
        )
        cookies += _set_cookies(r)
    assert r.status_code == 200, r.text[:300]
    names = {c.split("=", 1)[0] for c in cookies}
    assert "jupyterhub-session-id" in names or "jupyterhub-hub-login" in names, names
    assert any(n.startswith("jupyterhub-services") or "billing" in n for n in names), names
    for cookie in cookies:
        if cookie.split(";")[0].endswith(('=""', "=")):
            continue  # a cookie being cleared carries nothing to send
        assert re.search(r";\s*samesite=lax", cookie, re.I), cookie
