"""Users' servers and apps on origins of their own (hub_config/origins.py, docs/security.md
"Origins"), with the hub as `make demo` runs it: the hub at http://localhost:PORT, alice's
server at http://alice.localhost:PORT (Chromium resolves *.localhost to loopback).

alice serves a page from her own home through an app. An admin opens it and clicks
through the hub's "Authorize" page; the page then tries what an app could do under the hub's
origin: read the hub's home page (and its XSRF token), create an API token in the admin's
name, on the hub's host and on its own. None of it works, and the hub holds no new token.
"""

import time
from urllib.parse import urlsplit

import pytest
import requests
from playwright.sync_api import expect

from tests.browser.test_hub_pages import log_in
from tests.platform import Platform

CPU = {"kind": "cpu"}

PAGE = """<!doctype html><title>alice's page</title><pre id="out">running</pre><script>
const hub = "HUB";
async function attempt(name, request) {
  try {
    const r = await request();
    const text = await r.text();
    return `${name}: ${r.status} xsrf=${text.includes("_xsrf") || text.includes("xsrf_token")}`;
  } catch (e) {
    return `${name}: blocked`;
  }
}
const post = {method: "POST", credentials: "include",
              headers: {"Content-Type": "application/json"}, body: '{"note": "stolen"}'};
(async () => {
  const results = [
    await attempt("hub home", () => fetch(hub + "/hub/home", {credentials: "include"})),
    await attempt("own host home", () => fetch("/hub/home", {credentials: "include"})),
    await attempt("hub token", () => fetch(hub + "/hub/api/users/admin/tokens", post)),
    await attempt("own host token", () => fetch("/hub/api/users/admin/tokens", post)),
  ];
  document.getElementById("out").textContent = "done\\n" + results.join("\\n");
})();
</script>"""


@pytest.fixture(scope="module")
def platform(tmp_path_factory):
    root = tmp_path_factory.mktemp("origins")
    page = {
        "title": "Page",
        "command": ["python3", "-m", "http.server", "{port}", "--bind", "127.0.0.1"]
        + ["--directory", "~/site"],
    }
    p = Platform(
        root,
        extra={
            # as `make demo`: servers on subdomains of localhost, the hub at localhost
            "hub": {"subdomain_host": "auto", "admin_users": ["admin"]},
            "apps": {"custom": {"page": page}},
        },
    )
    # the hub's own host: billing's route is the hub host's (the proxy routes by host)
    hub = p.url = f"http://localhost:{p.port}"
    p.start()
    site = root / "data" / "homes" / "alice" / "site"
    site.mkdir(parents=True)
    (site / "index.html").write_text(PAGE.replace("HUB", hub))
    p.create_user("alice")
    p.create_user("admin")
    r = p.spawn("alice", CPU)
    assert r.status_code in (201, 202), r.text
    p.wait_ready("alice")
    yield p
    p.shutdown()


def at_host(platform, host: str, path: str, **kw) -> requests.Response:
    """GET ``path`` through the proxy as a browser asking for ``host`` (requests resolves no
    *.localhost name; the proxy routes by the Host header)."""
    headers = {"Host": f"{host}:{platform.port}", **kw.pop("headers", {})}
    return requests.get(f"{platform.url}{path}", headers=headers, timeout=30, **kw)


def test_alices_server_answers_on_her_host_and_the_hubs_host_sends_there(platform):
    token = platform.user_token("alice")
    auth = {"Authorization": f"token {token}"}
    mine = at_host(platform, "alice.localhost", "/user/alice/api/status", headers=auth)
    assert mine.status_code == 200, (mine.status_code, mine.text[:300])
    # on the hub's host the same path is not served by her server: the hub sends it to hers
    r = at_host(platform, "localhost", "/user/alice/api/status", allow_redirects=False)
    assert r.status_code == 302, r.status_code
    hub_page = urlsplit(r.headers["Location"])
    assert hub_page.netloc == f"localhost:{platform.port}", r.headers["Location"]
    r = at_host(platform, "localhost", hub_page.path, headers=auth, allow_redirects=False)
    assert r.headers["Location"].startswith(f"http://alice.localhost:{platform.port}/user/alice/")


def test_the_hubs_login_answers_only_on_the_hubs_host(platform):
    r = at_host(platform, "alice.localhost", "/hub/login?next=%2Fhub%2Fhome", allow_redirects=False)
    assert r.status_code == 302, (r.status_code, r.text[:300])
    assert r.headers["Location"] == f"http://localhost:{platform.port}/hub/login?next=%2Fhub%2Fhome"
    assert "Set-Cookie" not in r.headers or "jupyterhub-hub-login" not in r.headers["Set-Cookie"]
    r = at_host(platform, "localhost", "/hub/login", allow_redirects=False)
    assert r.status_code == 200 and "username_input" in r.text


def test_billing_stays_on_the_hubs_host(platform):
    r = at_host(platform, "localhost", "/services/billing/", allow_redirects=False)
    # billing's own login round trip, not the hub's "no such page"
    assert r.status_code == 302, (r.status_code, r.text[:300])
    assert "/hub/api/oauth2/authorize" in r.headers["Location"], r.headers["Location"]


def admin_tokens(platform) -> dict[str, dict]:
    r = platform.get("/users/admin/tokens")
    assert r.ok, r.text
    return {t["id"]: t for t in r.json()["api_tokens"]}


def test_an_admin_who_opens_alices_app_gives_it_nothing_of_the_hubs(platform, browser):
    hub = platform.url  # the hub's own host, http://localhost:PORT
    page = log_in(browser, platform, "admin")
    before = admin_tokens(platform)

    page.goto(f"http://alice.localhost:{platform.port}/user/alice/page/")
    # the hub asks the admin before letting them into alice's server; they click through
    page.get_by_role("button", name="Authorize").click()
    page.wait_for_url(f"http://alice.localhost:{platform.port}/user/alice/page/**")
    out = page.locator("#out")
    deadline = time.monotonic() + 30
    while not out.inner_text().startswith("done") and time.monotonic() < deadline:
        time.sleep(0.2)
    results = out.inner_text()
    assert results.startswith("done"), results
    for line in results.splitlines()[1:]:
        assert "xsrf=true" not in line, results  # nothing of the hub's page was readable
        assert not any(f": {code} " in line for code in (200, 201)), results
    # the one new token is the hub's grant to alice's server for this admin (clicking
    # Authorize): into her server and the admin's own name, nothing of the hub's
    new = [t for key, t in admin_tokens(platform).items() if key not in before]
    for token in new:
        assert token["oauth_client"] == "Server at /user/alice/", token
        assert token["note"] != "stolen", token
        assert set(token["scopes"]) <= {
            "access:servers!server=alice/",
            "read:users:name!user=admin",
            "read:users:groups!user=admin",
        }, token

    # a link of the app's to the hub's login on its own host lands on the hub's host
    page.goto(f"http://alice.localhost:{platform.port}/hub/login")
    assert page.url.startswith(f"{hub}/hub/"), page.url
    page.context.close()


def test_alices_lab_opens_on_her_host_with_gputaps_panel(platform, browser):
    """The tour's Lab, as `make demo` serves it: on alice's own host, the gputap panel reads
    her server and credit through her server's routes, and the hub's pages stay one click
    away on the hub's host."""
    hub = platform.url  # the hub's own host, http://localhost:PORT
    page = log_in(browser, platform, "alice")
    page.set_default_timeout(60_000)
    page.goto(f"http://alice.localhost:{platform.port}/user/alice/lab")
    status = page.get_by_test_id("gputap-status")
    expect(status).to_be_visible(timeout=90_000)
    expect(status).to_contain_text("credits", timeout=30_000)
    assert page.url.startswith(f"http://alice.localhost:{platform.port}/user/alice/lab")
    # JupyterLab's own link to the hub (File > Hub Control Panel) names the hub's host
    hub_host = page.evaluate(
        "() => JSON.parse(document.getElementById('jupyter-config-data').textContent).hubHost"
    )
    assert hub_host == hub, hub_host
    page.context.close()
