"""The worker's agent (gputap-lab's ``gputap-worker``) as a real process: it answers its group's
token only, runs one job at a time and streams its output, and a job whose caller goes away
ends with everything it started; plus ``gputap.run``'s launcher arguments and the magic's."""

from __future__ import annotations

import http.client
import io
import json
import os
import secrets
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import requests

from gputap.launch import _failure, _Printer, _Remote, launcher_args, node_env
from gputap.magic import parse
from gputap_lab.worker import OUTPUT_CHUNK, output_pieces
from spawner.local.workers import listening_socket
from tests.platform import free_port

ROOT = Path(__file__).resolve().parents[2]
EXTENSION = ROOT / "extensions" / "gputap-lab"


@pytest.fixture
def agent(tmp_path):
    token = secrets.token_urlsafe(24)
    port = free_port()
    env = {**os.environ, "GPUTAP_WORKER_TOKEN": token, "PYTHONPATH": str(EXTENSION),
           "GPUTAP_SIMULATED": "1"}  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-m", "gputap_lab.worker", "--port", str(port), "--name", "w1"],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    headers = {"Authorization": f"token {token}"}
    deadline = time.monotonic() + 30
    while True:
        try:
            if requests.get(url + "/status", headers=headers, timeout=2).ok:
                break
        except requests.RequestException:
            pass
        assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()
        time.sleep(0.1)
    yield url, headers, port, proc
    proc.terminate()
    proc.wait(10)


def stream(port: int, headers: dict, body: dict) -> tuple[http.client.HTTPConnection, object]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    connection.request("POST", "/run", json.dumps(body), headers)
    return connection, connection.getresponse()


def test_only_the_groups_token_is_answered(agent):
    url, headers, _, _ = agent
    assert requests.get(url + "/status", timeout=5).status_code == 403
    wrong = {"Authorization": "token " + "x" * 32}
    r = requests.post(url + "/run", headers=wrong, json={"argv": ["true"]}, timeout=5)
    assert (
        r.status_code == 403 and r.json()["message"] == "this worker answers its group's token only"
    )
    status = requests.get(url + "/status", headers=headers, timeout=5).json()
    assert status["name"] == "w1" and status["busy"] is False and status["job"] is None
    assert status["gpus"] is None and status["gpu_note"] == "simulated card: no live numbers"


def test_a_job_streams_its_output_and_its_exit(agent, tmp_path):
    url, headers, port, _ = agent
    before = requests.get(url + "/status", headers=headers, timeout=5).json()["idle_since"]
    code = "import os, sys; print('hello from', os.getcwd()); sys.exit(3)"
    _, response = stream(port, headers, {"argv": ["python", "-c", code], "cwd": str(tmp_path)})
    assert response.status == 200
    lines = [json.loads(line) for line in response]
    assert lines == [{"out": f"hello from {tmp_path}\n"}, {"exit": 3}]
    after = requests.get(url + "/status", headers=headers, timeout=5).json()["idle_since"]
    assert after > before


@pytest.mark.parametrize(
    "body, message",
    [
        ({"argv": []}, "argv must be a non-empty list of strings"),
        ({"argv": "ls"}, "argv must be a non-empty list of strings"),
        ({"argv": ["true"], "env": {"A": 1}}, "env must map names to strings"),
        ({"argv": ["true"], "shell": True}, "send a JSON object with argv, env and cwd only"),
        ({"argv": ["/no/such/program"]}, "cannot run program"),
    ],
)
def test_a_bad_job_is_refused(agent, body, message):
    url, headers, _, _ = agent
    r = requests.post(url + "/run", headers=headers, json=body, timeout=10)
    assert r.status_code == 400 and message in r.json()["message"]
    assert requests.get(url + "/status", headers=headers, timeout=5).json()["busy"] is False


@pytest.mark.parametrize(
    "raw",
    [b"[" * 30_000 + b"]" * 30_000, b'{"argv": ["true"], "env": ' + b"[" * 900 + b"]" * 900 + b"}"],
)
def test_a_job_nested_too_deep_is_a_400_that_says_so(agent, raw):
    url, headers, _, _ = agent
    r = requests.post(url + "/run", headers=headers, data=raw, timeout=10)
    assert r.status_code == 400, r.text
    assert "nested too deep" in r.json()["message"]
    assert requests.get(url + "/status", headers=headers, timeout=5).json()["busy"] is False


def test_one_job_at_a_time_and_a_gone_caller_ends_everything_it_started(agent, tmp_path):
    url, headers, port, _ = agent
    marker = secrets.token_hex(6)
    # the job starts a child in its own session (as a launcher's ranks are)
    code = (
        "import subprocess, sys, time\n"
        f"subprocess.Popen(['sleep', '300', '{marker}'[:0] or '300'], start_new_session=False)\n"
        f"print('started {marker}', flush=True)\n"
        "time.sleep(300)\n"
    )
    connection, response = stream(port, headers, {"argv": ["python", "-c", code]})
    assert json.loads(response.readline()) == {"out": f"started {marker}\n"}
    status = requests.get(url + "/status", headers=headers, timeout=5).json()
    assert status["busy"] is True and status["idle_since"] is None
    r = requests.post(url + "/run", headers=headers, json={"argv": ["true"]}, timeout=5)
    assert r.status_code == 409
    job = psutil.Process(status["job"]["pid"])
    family = [job, *job.children(recursive=True)]
    assert len(family) == 2
    connection.sock.shutdown(2)  # the notebook's cell was interrupted
    connection.close()
    gone, alive = psutil.wait_procs(family, timeout=15)
    assert alive == [], alive
    deadline = time.monotonic() + 10
    while requests.get(url + "/status", headers=headers, timeout=5).json()["busy"]:
        assert time.monotonic() < deadline
        time.sleep(0.1)


def test_delete_ends_the_running_job(agent):
    url, headers, port, _ = agent
    connection, response = stream(
        port,
        headers,
        {"argv": ["python", "-c", "import time; print('up', flush=True); time.sleep(60)"]},
    )
    assert json.loads(response.readline()) == {"out": "up\n"}
    r = requests.delete(url + "/run", headers=headers, timeout=20)
    assert r.status_code == 200 and r.json()["exit"] == -15
    assert json.loads(response.readline()) == {"exit": -15}
    connection.close()
    assert requests.delete(url + "/run", headers=headers, timeout=5).status_code == 204


def test_the_agent_refuses_to_start_without_its_token():
    env = {k: v for k, v in os.environ.items() if k != "GPUTAP_WORKER_TOKEN"}
    env["PYTHONPATH"] = str(EXTENSION)
    done = subprocess.run(
        [sys.executable, "-m", "gputap_lab.worker", "--port", str(free_port())],
        env=env, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert done.returncode == 2 and "GPUTAP_WORKER_TOKEN" in done.stderr


def test_every_node_runs_the_same_launcher_but_its_own_address():
    args = launcher_args(
        "train.py",
        ["--epochs", "2"],
        nodes=3,
        endpoint="127.0.0.1:29400",
        run_id="abc",
        local_addr="127.0.0.2",
        nproc_per_node=2,
        max_restarts=0,
    )
    assert args[:2] == ["-m", "torch.distributed.run"]
    assert "--nnodes=3" in args and "--nproc-per-node=2" in args
    assert "--rdzv-endpoint=127.0.0.1:29400" in args and "--local-addr=127.0.0.2" in args
    assert args[-3:] == ["train.py", "--epochs", "2"]
    elastic = launcher_args("t.py", [], nodes=3, endpoint="h:1", run_id="r", local_addr="h",
                            nproc_per_node=1, max_restarts=2)  # fmt: skip
    assert "--nnodes=1:3" in elastic and "--max-restarts=2" in elastic
    assert node_env(["127.0.0.1", "127.0.0.2"])["GLOO_SOCKET_IFNAME"] == "lo"
    assert "GLOO_SOCKET_IFNAME" not in node_env(["10.1.0.4", "10.1.0.9"])


def test_the_magic_splits_its_options_from_the_scripts():
    options, args = parse("--workers 2 --max-restarts 1 train.py --workers 9 -x")
    assert (options.workers, options.max_restarts, options.script) == (2, 1, "train.py")
    assert args == ["--workers", "9", "-x"]
    with pytest.raises(ValueError, match="usage: %gputap_run"):
        parse("--workers two train.py")


def test_the_agent_answers_on_the_socket_the_hub_bound_and_its_jobs_do_not_hold_it(tmp_path):
    """One machine: the hub binds the agent's socket and hands it over (--fd), so no other
    local user can take the port first; the agent's jobs do not inherit it."""
    token = secrets.token_urlsafe(24)
    env = {**os.environ, "GPUTAP_WORKER_TOKEN": token, "PYTHONPATH": str(EXTENSION)}
    with listening_socket("127.0.0.1") as sock:
        port = sock.getsockname()[1]
        proc = subprocess.Popen(
            [sys.executable, "-m", "gputap_lab.worker", "--fd", str(sock.fileno()),
             "--name", "w1"],
            env=env,
            cwd=tmp_path,
            pass_fds=(sock.fileno(),),
        )  # fmt: skip
    headers = {"Authorization": f"token {token}"}
    try:
        # the port was listening before the agent started: the first look waits, then answers
        r = requests.get(f"http://127.0.0.1:{port}/status", headers=headers, timeout=30)
        assert r.status_code == 200 and r.json()["busy"] is False
        connection, response = stream(
            port, headers, {"argv": ["sh", "-c", "ls -l /proc/self/fd"], "env": {}, "cwd": ""}
        )
        lines = [json.loads(line) for line in response.read().decode().splitlines()]
        connection.close()
        assert lines[-1] == {"exit": 0}
        listed = "".join(line.get("out", "") for line in lines)
        assert "socket:" not in listed, listed
    finally:
        proc.terminate()
        proc.wait(10)


def test_progress_without_a_newline_streams_and_the_job_ends_in_order(agent):
    url, headers, port, proc = agent
    # tqdm's way: 200 KB of updates, each after a carriage return, and no newline at all
    code = "import sys\nfor i in range(20000): sys.stdout.write(f'\\r{i:9d}')\nsys.stdout.flush()"
    connection, response = stream(port, headers, {"argv": ["python", "-c", code]})
    assert response.status == 200
    lines = [json.loads(line) for line in response]
    connection.close()
    assert lines[-1] == {"exit": 0}
    out = "".join(line["out"] for line in lines[:-1])
    assert out == "".join(f"\r{i:9d}" for i in range(20000))
    assert all(len(line["out"]) <= 64 * 1024 for line in lines[:-1])
    status = requests.get(url + "/status", headers=headers, timeout=5).json()
    assert status["busy"] is False
    assert psutil.Process(proc.pid).children(recursive=True) == []


def test_output_is_sent_by_lines_and_carriage_returns():
    assert output_pieces("a\nb\r\nc\rd") == (["a\n", "b\r\n", "c\r"], "d")
    # a "\r" that ends a read waits: its "\n" may come next
    assert output_pieces("50%\r") == ([], "50%\r")
    assert output_pieces("50%\r\n") == (["50%\r\n"], "")
    assert output_pieces("50%\r", final=True) == (["50%\r"], "")
    long = "x" * (OUTPUT_CHUNK + 10)
    assert output_pieces(long) == (["x" * OUTPUT_CHUNK], "x" * 10)
    assert output_pieces("x", final=True) == (["x"], "")


def test_jobs_sent_at_once_start_one(agent):
    url, headers, port, proc = agent
    code = "import time; print('up', flush=True); time.sleep(30)"
    body = json.dumps({"argv": ["python", "-c", code]}).encode()
    request = (
        f"POST /run HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: {headers['Authorization']}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    sockets = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(6)]
    for s in sockets:
        s.sendall(request[:-1])
    time.sleep(0.2)
    for s in sockets:  # every request completes at once
        s.send(request[-1:])
    statuses = sorted(s.recv(4096).split(b" ", 2)[1] for s in sockets)
    jobs = psutil.Process(proc.pid).children(recursive=True)
    for s in sockets:
        s.close()
    psutil.wait_procs(jobs, timeout=15)
    assert statuses == [b"200"] + [b"409"] * 5
    assert len(jobs) == 1, jobs


@pytest.mark.parametrize(
    "body, where",
    [
        ({"argv": ["echo", "a\0b"]}, "argv"),
        ({"argv": ["true"], "env": {"A": "x\0y"}}, "env"),
        ({"argv": ["true"], "env": {"A\0B": "x"}}, "env"),
        ({"argv": ["true"], "cwd": "/tmp\0/x"}, "cwd"),
    ],
)
def test_a_nul_character_is_refused_by_name(agent, body, where):
    url, headers, _, _ = agent
    r = requests.post(url + "/run", headers=headers, json=body, timeout=10)
    assert r.status_code == 400, r.text
    message = r.json()["message"]
    assert where in message and "NUL" in message and "\0" not in message
    assert requests.get(url + "/status", headers=headers, timeout=5).json()["busy"] is False


@pytest.mark.parametrize("name", ["", "A=B"])
def test_an_environment_name_must_be_one(agent, name):
    url, headers, _, _ = agent
    r = requests.post(url + "/run", headers=headers, json={"argv": ["true"], "env": {name: "x"}},
                      timeout=10)  # fmt: skip
    assert r.status_code == 400 and "env" in r.json()["message"], r.text


def test_a_failed_run_and_its_lines_never_show_the_token(agent):
    url, headers, port, _ = agent
    token = headers["Authorization"].split()[1]
    out = io.StringIO()
    printer = _Printer(out)
    # the job prints its whole environment: the agent keeps its token from jobs
    code = "import os, sys; print(dict(os.environ)); sys.exit(2)"
    body = {"argv": ["python", "-c", code]}
    ran = _Remote({"name": "w1", "host": "127.0.0.1", "port": port}, token, body)
    wrong = _Remote({"name": "w2", "host": "127.0.0.1", "port": port}, "x" + token, body)
    gone = _Remote({"name": "w3", "host": "127.0.0.1", "port": free_port()}, token, body)
    for remote in (ran, wrong, gone):
        remote.run(printer)
    failed = _failure(1, [ran, wrong, gone])
    assert failed is not None and failed.exits == {"notebook": 1, "w1": 2, "w2": None, "w3": None}
    assert "w2: its agent refused the job (403)" in str(failed) and "w3: the connection" in str(
        failed
    )
    assert "[w1] {" in out.getvalue()
    for text in (str(failed), repr(failed), out.getvalue()):
        assert token not in text
