"""Environments through the real hub on one machine: a start names one (user_options
``environment``) or gets the default; one that is unknown, not the user's, or whose needs the
GPU asked for does not meet is a 400 that says what is allowed, and nothing starts; the server
runs the environment's own jupyterhub-singleuser; billing records the environment."""

import secrets
import sys
from pathlib import Path

import psutil
import pytest
import requests

from tests.platform import Platform

#: the marker the test environment's jupyterhub-singleuser puts in its server's environment
MARK = "GPUTAP_TEST_ENVIRONMENT_RAN"


def python_environment(root: Path) -> Path:
    """A Python environment's folder whose bin/jupyterhub-singleuser is its own: it marks the
    server's environment, then runs the test venv's jupyterhub-singleuser."""
    bin_dir = root / "bin"
    bin_dir.mkdir(parents=True)
    singleuser = bin_dir / "jupyterhub-singleuser"
    real = Path(sys.executable).parent / "jupyterhub-singleuser"
    singleuser.write_text(f'#!/bin/sh\nexport {MARK}="$0"\nexec {real} "$@"\n')
    singleuser.chmod(0o755)  # as an installed program is: every server account runs it
    return root


def singleuser_ran(hub: Platform, name: str) -> str:
    """Which test environment's jupyterhub-singleuser runs the user's server (under the
    reaper, whose child it is): the marker it left, or "" for none."""
    reaper = psutil.Process(hub.server(name)["state"]["pid"])
    marks = {p.environ().get(MARK, "") for p in reaper.children(recursive=True)}
    assert len(marks) == 1, marks
    return marks.pop()


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    root = tmp_path_factory.mktemp("environments")
    groups_token = secrets.token_hex(16)
    torch = python_environment(root / "torch-env")
    p = Platform(
        root,
        extra={
            "environments": {
                "torch": {
                    "name": "PyTorch (test)",
                    "tags": ["pytorch"],
                    "python": str(torch),
                    "needs": {"gpu": True, "min_gpu_memory_gb": 20},
                },
                "staff-only": {"name": "Staff's", "allowed": {"groups": ["staff"]}},
            }
        },
        services=[{"name": "groups", "api_token": groups_token, "scopes": ["admin:groups"]}],
    )
    p.groups = requests.Session()
    p.groups.headers["Authorization"] = f"token {groups_token}"
    p.start()
    yield p
    p.shutdown()


@pytest.mark.parametrize(
    "options, message",
    [
        (
            {"kind": "cpu", "environment": "tensorflow"},
            "environment 'tensorflow' is not an environment here; you may use: gputap, torch",
        ),
        (
            {"kind": "cpu", "environment": "x" * 5000},
            "(5000 characters) is not an environment here; you may use: gputap, torch",
        ),
        (
            {"kind": "cpu", "environment": "staff-only"},
            "environment 'staff-only' is not one of yours; you may use: gputap, torch",
        ),
        ({"kind": "cpu", "environment": "torch"}, "environment torch needs a GPU"),
        (
            {
                "kind": "slice",
                "card": "A100-80GB",
                "mig_profile": "1g.10gb",
                "environment": "torch",
            },
            "environment torch needs ≥ 20 GB of GPU memory; A100-80GB 1g.10gb slice has 10 GB",
        ),
        ({"kind": "cpu", "image": "python:3.12"}, "free-text images are not allowed here"),
        ({"kind": "cpu", "environment": 3}, "environment must be"),
    ],
)
def test_an_environment_that_cannot_be_had_is_a_400_saying_what_may(hub, options, message):
    hub.create_user("eve")
    r = hub.spawn("eve", options)
    assert r.status_code == 400, r.text
    text = r.json()["message"]
    assert message in text
    assert "x" * 100 not in text  # a long input is not echoed whole
    assert hub.server("eve") is None
    assert hub.sessions("eve") == []


def test_a_server_runs_its_environments_singleuser_and_billing_records_it(hub):
    hub.create_user("ada")
    r = hub.spawn("ada", {"kind": "card", "card": "RTX-4090", "environment": "torch"})
    assert r.status_code in (201, 202), r.text + hub.log_tail()
    hub.wait_ready("ada")
    env = hub.server_env("ada")
    assert singleuser_ran(hub, "ada").endswith("torch-env/bin/jupyterhub-singleuser")
    assert env["GPUTAP_ENVIRONMENT"] == "torch"
    assert env["PATH"].split(":")[0].endswith("torch-env/bin")
    [session] = hub.sessions("ada")
    assert session["environment"] == "torch"
    # the server's own token reads its environment (the Lab panel's view)
    facts = requests.get(
        f"{hub.url}/hub/gputap/api/users/ada/server",
        headers={"Authorization": f"token {env['JUPYTERHUB_API_TOKEN']}"},
        timeout=10,
    ).json()
    assert facts["environment"] == {
        "key": "torch",
        "name": "PyTorch (test)",
        "description": "",
        "tags": ["pytorch"],
    }
    hub.stop_server("ada")

    # no environment: the default, the hub's own jupyterhub-singleuser
    r = hub.spawn("ada", {"kind": "cpu"})
    assert r.status_code in (201, 202), r.text + hub.log_tail()
    hub.wait_ready("ada")
    env = hub.server_env("ada")
    assert singleuser_ran(hub, "ada") == "" and env["GPUTAP_ENVIRONMENT"] == "gputap"
    latest = max(hub.sessions("ada"), key=lambda s: s["started_at"])
    assert latest["environment"] == "gputap"
    hub.stop_server("ada")


def test_a_groups_environment_starts_for_its_members(hub):
    hub.create_user("sam")
    r = hub.groups.post(f"{hub.url}/hub/api/groups/staff", json={"users": ["sam"]}, timeout=10)
    assert r.status_code in (200, 201), r.text
    r = hub.spawn("sam", {"kind": "cpu", "environment": "staff-only"})
    assert r.status_code in (201, 202), r.text + hub.log_tail()
    hub.wait_ready("sam")
    assert hub.server_env("sam")["GPUTAP_ENVIRONMENT"] == "staff-only"
    hub.stop_server("sam")


def test_a_course_pins_the_environment_of_the_servers_it_pays_for(hub):
    r = hub.billing(
        "api/courses",
        "POST",
        {"name": "Deep learning", "allowed": ["RTX-4090"], "environment": "torch"},
    )
    assert r.status_code == 201 and r.json()["environment"] == "torch", r.text
    slug = r.json()["slug"]
    r = hub.billing("api/courses", "POST", {"name": "X", "allowed": ["T4"], "environment": "tf"})
    assert r.status_code == 400
    assert (
        "'tf' is not one of the hub's environments; choose one of gputap, staff-only, torch"
        in (r.json()["message"])
    )
    hub.create_user("stu")
    r = hub.billing(f"api/courses/{slug}/students", "POST", {"username": "stu"})
    assert r.status_code in (200, 201), r.text
    card = {"kind": "card", "card": "RTX-4090", "course": slug}
    r = hub.spawn("stu", {**card, "environment": "gputap"})
    assert r.status_code == 400, r.text
    assert f"course {slug} runs its servers in environment torch" in r.json()["message"]
    assert hub.server("stu") is None
    r = hub.spawn("stu", card)
    assert r.status_code in (201, 202), r.text + hub.log_tail()
    hub.wait_ready("stu")
    assert singleuser_ran(hub, "stu").endswith("torch-env/bin/jupyterhub-singleuser")
    [session] = hub.sessions("stu")
    assert (session["course"], session["environment"]) == (slug, "torch")
    hub.stop_server("stu")


def test_the_spawn_form_offers_the_users_environments_and_starts_the_one_picked(hub):
    s = hub.login("flo")
    page = s.get(f"{hub.url}/hub/spawn", timeout=30).content.decode()
    picker = page[page.index('id="gputap-environments"') : page.index("</fieldset>", page.index(
        'id="gputap-environments"'))]  # fmt: skip
    assert 'value="gputap" checked' in picker and 'value="torch"' in picker
    assert "staff-only" not in picker  # flo is not staff
    assert '<span class="gputap-tag">pytorch</span>' in picker
    assert "needs ≥ 20 GB of GPU memory" in picker
    r = s.post(
        f"{hub.url}/hub/spawn",
        data={"choice": "card:RTX-4090", "environment": "torch", "_xsrf": s.cookies.get("_xsrf")},
        timeout=60,
    )
    assert r.status_code < 400, r.text[-2000:]
    hub.wait_ready("flo")
    assert hub.server_env("flo")["GPUTAP_ENVIRONMENT"] == "torch"
    hub.stop_server("flo")
