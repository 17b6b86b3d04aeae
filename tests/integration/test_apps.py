"""Apps through the real hub and proxy (docs/lab.md, "Apps"): TensorBoard opened at its URL
shows a run written into ~/runs, an operator's app is a launcher entry and answers at its own
URL, a program the user starts on a port answers at /user/NAME/proxy/PORT/, and another user
opens none of them."""

import re
import sys
import time

import pytest
import requests
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.event_file_writer import EventFileWriter

from tests.integration.test_local_processes import type_in_terminal
from tests.integration.test_spawn_and_bill import wait_through_proxy
from tests.platform import Platform, free_port

CPU = {"kind": "cpu"}


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The operator's app's files: a page python -m http.server serves."""
    folder = tmp_path_factory.mktemp("site")
    (folder / "index.html").write_text("<h1>the operator's notes app</h1>")
    folder.chmod(0o755)  # the servers' accounts read it
    return folder


@pytest.fixture(scope="module")
def platform(tmp_path_factory, site):
    notes = {
        "title": "Notes",
        "command": [sys.executable, "-m", "http.server", "{port}", "--bind", "127.0.0.1"]
        + ["--directory", str(site)],
        "icon": "tensorboard.svg",
    }
    p = Platform(tmp_path_factory.mktemp("apps"), extra={"apps": {"custom": {"notes": notes}}})
    p.start()
    yield p
    p.shutdown()


@pytest.fixture(scope="module")
def alice(platform):
    """alice's running CPU server and her token; bob's token, who has a server too."""
    tokens = {}
    for name in ("alice", "bob"):
        platform.create_user(name)
        tokens[name] = platform.user_token(name)
        r = platform.spawn(name, CPU)
        assert r.status_code in (201, 202), r.text
    for name, token in tokens.items():
        wait_through_proxy(platform, name, token)
    return tokens


def as_user(token: str) -> requests.Session:
    s = requests.Session()
    s.headers["Authorization"] = f"token {token}"
    return s


def write_run(folder, tag: str, values: list[float]) -> None:
    """A run as torch.utils.tensorboard writes it: TensorBoard's event file writer, one
    scalar summary per step."""
    writer = EventFileWriter(str(folder))
    for step, value in enumerate(values):
        summary = summary_pb2.Summary(
            value=[summary_pb2.Summary.Value(tag=tag, simple_value=value)]
        )
        writer.add_event(event_pb2.Event(wall_time=time.time(), step=step, summary=summary))
    writer.close()


def get_until(session, url: str, ok, timeout: float = 60) -> requests.Response:
    """GET ``url`` until ``ok(response)`` (an app starts at its first request, and TensorBoard
    reads its runs a few seconds later)."""
    deadline = time.monotonic() + timeout
    while True:
        r = session.get(url, timeout=30)
        if ok(r) or time.monotonic() > deadline:
            return r
        time.sleep(0.5)


def test_tensorboard_opens_through_the_hub_and_shows_a_run_in_runs(platform, alice):
    home = platform.root / "data" / "homes" / "alice"
    write_run(home / "runs" / "first-try", "loss", [1.0, 0.5, 0.25])
    user = as_user(alice["alice"])
    base = f"{platform.url}/user/alice/tensorboard/"

    page = user.get(base, timeout=90)
    assert page.status_code == 200, page.text[:300]
    assert "<tb-webapp>" in page.text, page.text[:300]
    # its page's relative links (the app, its data) resolve below the proxied prefix
    [script] = re.findall(r'<script src="(index\.js[^"]*)"', page.text)
    js = user.get(base + script, timeout=30)
    assert js.ok and "javascript" in js.headers["Content-Type"], js.headers
    runs = get_until(user, base + "data/runs", lambda r: r.ok and r.json())
    assert runs.json() == ["first-try"], runs.text
    tags = user.get(base + "data/plugin/scalars/tags", timeout=30)
    assert tags.ok and "loss" in tags.json()["first-try"], tags.text
    scalars = user.get(
        base + "data/plugin/scalars/scalars", params={"run": "first-try", "tag": "loss"}, timeout=30
    )
    assert [step for _, step, _ in scalars.json()] == [0, 1, 2], scalars.text
    assert [value for _, _, value in scalars.json()] == [1.0, 0.5, 0.25]


def last_activity(session, platform, name: str) -> str:
    """The server's own last activity (what it reports to the hub for idle culling); asking
    for it is no activity."""
    r = session.get(f"{platform.url}/user/{name}/api/status", timeout=30)
    assert r.ok, r.text[:300]
    return r.json()["last_activity"]


def test_tensorboard_polling_is_not_activity_an_operators_app_is(platform, alice):
    user = as_user(alice["alice"])
    base = f"{platform.url}/user/alice/"
    assert get_until(user, base + "notes/", lambda r: r.ok).ok  # started
    assert get_until(user, base + "tensorboard/data/runs", lambda r: r.ok).ok
    before = last_activity(user, platform, "alice")
    time.sleep(1.1)
    # what an open TensorBoard tab asks every 30 s by itself
    for path in ("data/environment", "data/runs", "data/plugins_listing"):
        assert user.get(base + "tensorboard/" + path, timeout=30).ok
    assert last_activity(user, platform, "alice") == before
    assert user.get(base + "notes/", timeout=30).ok
    assert last_activity(user, platform, "alice") > before


def test_the_operators_app_is_a_launcher_entry_and_answers_at_its_url(platform, alice):
    user = as_user(alice["alice"])
    info = user.get(f"{platform.url}/user/alice/server-proxy/servers-info", timeout=30)
    assert info.status_code == 200, info.text[:300]
    apps = {s["name"]: s for s in info.json()["server_processes"]}
    assert set(apps) == {"tensorboard", "notes"}
    entry = apps["notes"]["launcher_entry"]
    assert entry["enabled"] is True and entry["title"] == "Notes", entry
    assert entry["path_info"] == "notes/"
    assert apps["tensorboard"]["launcher_entry"]["title"] == "TensorBoard"
    icon = user.get(f"{platform.url}{entry['icon_url']}", timeout=30)
    assert icon.ok and "<svg" in icon.text, icon.text[:200]

    page = user.get(f"{platform.url}/user/alice/notes/", timeout=60)
    assert page.status_code == 200, page.text[:300]
    assert "the operator's notes app" in page.text


def serve_from_alices_terminal(platform, alice, folder: str, name: str, text: str) -> str:
    """alice's own http.server on a free port of her server, started in her terminal and
    serving the file ``folder/name`` holding ``text``; the file's proxy URL."""
    port = free_port()
    type_in_terminal(
        platform,
        "alice",
        alice["alice"],
        f"mkdir -p {folder} && echo {text} > {folder}/{name} && "
        f"python3 -m http.server {port} --bind 127.0.0.1 --directory {folder}",
    )
    return f"{platform.url}/user/alice/proxy/{port}/{name}"


def test_a_users_own_app_on_a_port_answers_at_its_proxy_url(platform, alice):
    url = serve_from_alices_terminal(platform, alice, "shared", "hello.txt", "alice-made-this")
    r = get_until(as_user(alice["alice"]), url, lambda r: r.status_code == 200, timeout=30)
    assert r.status_code == 200 and r.text == "alice-made-this\n", (r.status_code, r.text[:300])


@pytest.mark.parametrize("path", ["tensorboard/data/runs", "notes/", "server-proxy/servers-info"])
def test_another_user_opens_none_of_alices_apps(platform, alice, path):
    url = f"{platform.url}/user/alice/{path}"
    # alice's own request first: the app is up, so a refusal is the proxy's, not a dead app
    assert get_until(as_user(alice["alice"]), url, lambda r: r.ok).ok
    r = as_user(alice["bob"]).get(url, timeout=30, allow_redirects=False)
    assert r.status_code == 403, (r.status_code, r.text[:300])
    assert "first-try" not in r.text and "notes app" not in r.text
    # no login at all: sent to log in, shown nothing
    r = requests.get(url, timeout=30, allow_redirects=False)
    assert r.status_code == 302 and "/hub/" in r.headers["Location"], r.status_code


def test_another_user_cannot_reach_alices_own_port(platform, alice):
    url = serve_from_alices_terminal(platform, alice, "private", "secret.txt", "alice-only")
    assert get_until(as_user(alice["alice"]), url, lambda r: r.ok, timeout=30).ok
    r = as_user(alice["bob"]).get(url, timeout=30, allow_redirects=False)
    assert r.status_code == 403, (r.status_code, r.text[:300])
    assert "alice-only" not in r.text
    # bob's browser session (his login cookie) is refused too, after the OAuth round trip
    browser = platform.login("bob")
    r = browser.get(url, timeout=30)
    assert r.status_code == 403, (r.status_code, r.text[:300])
    assert "alice-only" not in r.text


def test_another_users_own_proxy_to_alices_port_gets_nothing(platform, alice):
    """Servers on one machine share loopback: bob's own /proxy/PORT/ must still reach only
    what his own server started, never alice's app on that port."""
    url = serve_from_alices_terminal(platform, alice, "mine", "secret.txt", "alice-only")
    assert get_until(as_user(alice["alice"]), url, lambda r: r.ok, timeout=30).ok
    bobs_own = url.replace("/user/alice/", "/user/bob/")
    r = as_user(alice["bob"]).get(bobs_own, timeout=30, allow_redirects=False)
    assert r.status_code == 403, (r.status_code, r.text[:300])
    assert "alice-only" not in r.text
    port = bobs_own.split("/proxy/")[1].split("/")[0]
    assert f"nothing your server started listens on port {port}" in r.text.lower(), r.text[:500]
