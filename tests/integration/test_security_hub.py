"""Security rules of the hub's side (docs/security.md), on the real platform: no spawn from a
GET's query, the hub's gputap API refuses unknown keys and huge bodies, billing gets only its
own settings, and the data directory is private to the hub's user."""

import re
import stat
from pathlib import Path

import psutil
import pytest
import requests
import yaml


def test_a_spawn_link_with_a_query_starts_nothing_and_shows_the_form(platform):
    browser = platform.login("linked")
    # what a cross-site link or an <img> would make the browser ask for
    r = browser.get(f"{platform.url}/hub/spawn/linked?choice=cpu", timeout=30)
    assert r.status_code == 200, r.text[:300]
    assert "Press Start to start this server" in r.text
    assert platform.server("linked") is None
    # the form's own POST (with its XSRF token) still starts the server
    xsrf = browser.cookies.get("_xsrf")
    r = browser.post(
        f"{platform.url}/hub/spawn/linked", data={"choice": "cpu", "_xsrf": xsrf}, timeout=60
    )
    assert r.ok, r.text[:300]
    platform.wait_ready("linked")
    platform.stop_server("linked")


def _hub_api(platform, user, method, path, **kwargs):
    """Call the hub's gputap API as ``user`` (with a token of theirs)."""
    platform.create_user(user)
    headers = {"Authorization": f"token {platform.user_token(user)}"}
    url = f"{platform.url}/hub/gputap/api/{path}"
    return requests.request(method, url, headers=headers, timeout=30, **kwargs)


@pytest.mark.parametrize(
    "path, body",
    [
        ("users/keys/disks", {"name": "data", "size_gb": 1, "sizegb": 2}),
        ("users/keys/disks/data/attach", {"server": "", "mount": "/x"}),
        ("users/keys/disks/data/detach", {"sever": ""}),
        ("users/keys/server/change", {"options": {"kind": "cpu"}, "queu": True}),
    ],
)
def test_the_hub_api_refuses_unknown_keys_naming_them_and_the_allowed_ones(platform, path, body):
    r = _hub_api(platform, "keys", "POST", path, json=body)
    assert r.status_code == 400, r.text
    message = r.json()["message"]
    [unknown] = [k for k in body if k in ("sizegb", "mount", "sever", "queu")]
    assert unknown in message and "allowed" in message.lower(), message


def test_the_hub_api_refuses_huge_and_deep_bodies_with_a_4xx_that_does_not_echo_them(platform):
    r = _hub_api(platform, "big", "POST", "users/big/disks", data="{" + '"a": 1,' * 300_000 + "}")
    assert r.status_code == 413, r.text[:300]
    r = _hub_api(platform, "big", "POST", "users/big/disks", data="[" * 7_000 + "]" * 7_000)
    assert r.status_code == 400 and len(r.text) < 500, r.text[:300]
    assert "nested too deep (more than 32 levels" in r.json()["message"]
    deep_value = '{"name": ' + "[" * 900 + "]" * 900 + "}"
    r = _hub_api(platform, "big", "POST", "users/big/disks", data=deep_value)
    assert r.status_code == 400 and "nested too deep" in r.json()["message"], r.text[:300]
    name = "n" * 5000
    r = _hub_api(platform, "big", "POST", "users/big/disks", json={"name": name, "size_gb": 1})
    assert 400 <= r.status_code < 500 and name[:200] not in r.text
    assert name[:200] not in platform.log_path.read_text(errors="replace")


def _billing_process(platform) -> psutil.Process:
    hub = psutil.Process(platform.proc.pid)
    [billing] = [
        p for p in hub.children(recursive=True) if "billing_service" in " ".join(p.cmdline())
    ]
    return billing


def test_billing_gets_only_the_settings_it_needs(platform):
    env = _billing_process(platform).environ()
    secrets_in_env = [k for k, v in env.items() if platform.ops_token in v]
    assert secrets_in_env == []
    settings = Path(env["GPUTAP_SETTINGS"])
    assert settings != platform.settings_path
    assert stat.S_IMODE(settings.stat().st_mode) == 0o600
    text = settings.read_text()
    assert platform.ops_token not in text
    data = yaml.safe_load(text)
    # environments: the keys a course may pin its servers to (docs/courses.md)
    assert set(data) <= {"data_dir", "billing", "spawner", "environments"}, set(data)
    assert data["billing"]["port"] == platform.billing_port
    assert not [k for k in env if k.startswith("GPUTAP__")]


def test_the_data_directory_its_databases_and_secrets_are_private(platform):
    data = platform.root / "data"
    assert stat.S_IMODE(data.stat().st_mode) == 0o700
    seen = set()
    for path in data.rglob("*"):
        if path.is_symlink() or path.parent.name == "homes" or "homes" in path.parts:
            continue
        mode = stat.S_IMODE(path.stat().st_mode)
        if path.is_dir():
            assert mode & 0o077 == 0, (path, oct(mode))
        else:
            assert mode & 0o077 == 0, (path, oct(mode))
            seen.add(path.name)
    for name in ("jupyterhub.sqlite", "billing.sqlite", "jupyterhub_cookie_secret"):
        assert name in seen, seen
    assert any(re.fullmatch(r"billing.*cookie.*", n) for n in seen), seen


def test_servers_get_samesite_cookie_options(platform):
    platform.create_user("cookies")
    r = platform.spawn("cookies", {"kind": "cpu"})
    assert r.status_code in (201, 202), r.text
    platform.wait_ready("cookies")
    env = platform.server_env("cookies")
    assert re.search(r'"samesite":\s*"Lax"', env.get("JUPYTERHUB_COOKIE_OPTIONS", "")), env.get(
        "JUPYTERHUB_COOKIE_OPTIONS"
    )
    platform.stop_server("cookies")
