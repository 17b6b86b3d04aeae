"""On one machine no process a server started outlives its server: a kernel's or terminal's
detached daemon (double fork + setsid, even one ignoring SIGTERM) ends with the server, and
the server's devices go to the next user only once it has.

The daemons are started the way a user would, in a terminal of their running JupyterLab
(the Jupyter server's terminals API and its websocket, through the proxy).
"""

import asyncio
import json
import os
import random
import time
from datetime import datetime

import psutil
import requests
from tornado.httpclient import HTTPRequest
from tornado.websocket import websocket_connect

from tests.integration.test_spawn_and_bill import wait_through_proxy

CARD = {"kind": "card", "card": "T4"}  # the only one: the next user gets the same


def type_in_terminal(platform, name: str, token: str, line: str) -> None:
    """Open a terminal in the user's server and type ``line`` into it."""
    r = requests.post(
        f"{platform.url}/user/{name}/api/terminals",
        headers={"Authorization": f"token {token}"},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    terminal = r.json()["name"]
    ws_url = platform.url.replace("http", "ws") + f"/user/{name}/terminals/websocket/{terminal}"
    request = HTTPRequest(ws_url, headers={"Authorization": f"token {token}"})

    async def type_line() -> None:
        ws = await websocket_connect(request)
        try:
            await ws.read_message()  # the terminal's setup message: it is ready for input
            ws.write_message(json.dumps(["stdin", line + "\r"]))
            await asyncio.sleep(1)
        finally:
            ws.close()

    asyncio.run(type_line())


def processes_named(marker: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        if proc.info["status"] != psutil.STATUS_ZOMBIE and marker in (proc.info["cmdline"] or []):
            found.append(proc)
    return found


def wait_for_processes(marker: str, count: int, timeout: float = 20) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = processes_named(marker)
        if len(found) >= count:
            return found
        time.sleep(0.2)
    raise AssertionError(f"the daemons ({marker}) never started")


def test_a_servers_detached_daemons_end_before_its_device_is_free(platform):
    platform.create_user("dora")
    platform.create_user("eli")
    token = platform.user_token("dora")
    r = platform.spawn("dora", CARD)
    assert r.status_code in (201, 202), r.text
    wait_through_proxy(platform, "dora", token)
    platform.wait_ready("dora")
    device = platform.server_env("dora")["CUDA_VISIBLE_DEVICES"]

    seconds = f"{random.randint(10**6, 10**7)}.5"  # marks the daemons of this test
    stubborn = (
        f"import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep({seconds})"
    )
    # two daemons: a plain one, and one that ignores SIGTERM; both double fork and setsid
    line = f"(setsid sleep {seconds} &); (setsid python3 -c '{stubborn}' {seconds} &)"
    type_in_terminal(platform, "dora", token, line)
    daemons = wait_for_processes(seconds, 2)
    server_pid = platform.server("dora")["state"]["pid"]
    # detached: sessions of their own, outside the server's
    assert all(os.getsid(d.pid) != os.getsid(server_pid) for d in daemons)

    platform.stop_server("dora")
    left = [d.pid for d in daemons if d.is_running() and d.status() != psutil.STATUS_ZOMBIE]
    assert left == [], f"dora's daemons {left} outlived her server"

    # the card is free now, and the next user's server gets it
    r = platform.spawn("eli", CARD)
    assert r.status_code in (201, 202), r.text
    platform.wait_ready("eli")
    assert platform.server_env("eli")["CUDA_VISIBLE_DEVICES"] == device
    platform.stop_server("eli")


def test_a_server_whose_reaper_is_killed_outright_ends_is_billed_to_then_and_frees_its_gpu(
    platform,
):
    """kill -9 of the pid the hub records (the server's reaper) once left the server running,
    re-parented to init: billing ended and its GPU went to the next server while it ran on."""
    platform.create_user("fay")
    platform.create_user("gus")
    token = platform.user_token("fay")
    assert platform.spawn("fay", CARD).status_code in (201, 202)
    wait_through_proxy(platform, "fay", token)
    platform.wait_ready("fay")
    seconds = f"{random.randint(10**6, 10**7)}.5"
    type_in_terminal(platform, "fay", token, f"sleep {seconds}")  # a terminal's job
    [job] = wait_for_processes(seconds, 1)
    reaper = psutil.Process(platform.server("fay")["state"]["pid"])
    [server] = reaper.children()
    # and a daemon that escaped the terminal (double fork, setsid): the reaper adopts it, so
    # once the reaper is gone nothing but the hub can end it
    detached = f"{random.randint(10**6, 10**7)}.5"
    type_in_terminal(platform, "fay", token, f"(setsid sleep {detached} &)")
    [daemon] = wait_for_processes(detached, 1)
    [session] = platform.sessions("fay")

    reaper.kill()
    killed = time.time()
    gone = psutil.wait_procs([server, job], timeout=10)[1]
    assert gone == [], f"{gone} outlived the reaper"
    platform.wait_for(lambda: platform.server("fay") is None, "the hub found fay's server gone")
    # the GPU goes to the next server only once nothing of fay's runs on it
    assert not daemon.is_running() or daemon.status() == psutil.STATUS_ZOMBIE, (
        "fay's detached daemon outlived her server and its GPU was free again"
    )
    [ended] = [s for s in platform.sessions("fay") if s["id"] == session["id"]]
    assert ended["state"] == "ended"
    ended_at = datetime.fromisoformat(ended["ended_at"]).timestamp()
    assert ended_at <= killed + 1  # billed until it was last seen alive, not beyond

    # the card is free, and the next user's server gets it
    assert platform.spawn("gus", CARD).status_code in (201, 202)
    platform.wait_ready("gus")
    platform.stop_server("gus")


def test_a_terminal_runs_the_servers_own_python_after_the_login_scripts(platform):
    """Lab's terminal is a login shell, and Debian's /etc/profile resets PATH: the README's
    `python -m http.server 8080` found no python, or the system's, without the environment's
    packages. The server's own PATH comes first again once the login scripts ran."""
    platform.create_user("hal")
    token = platform.user_token("hal")
    assert platform.spawn("hal", {"kind": "cpu"}).status_code in (201, 202)
    wait_through_proxy(platform, "hal", token)
    platform.wait_ready("hal")
    own = platform.server_env("hal")["PATH"].split(os.pathsep)[0]
    type_in_terminal(platform, "hal", token, "command -v python > which-python.txt")
    url = f"{platform.url}/user/hal/api/contents/which-python.txt"
    headers = {"Authorization": f"token {token}"}

    def written() -> str | None:
        r = requests.get(url, headers=headers, timeout=30)
        return r.json()["content"].strip() if r.status_code == 200 else None

    assert platform.wait_for(written, "the terminal's answer", timeout=30) == f"{own}/python"
    platform.stop_server("hal")
