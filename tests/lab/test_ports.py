"""Which ports a server's /proxy/PORT/ reaches (gputap_lab/ports.py): those a process of its
own tree listens on, never another's, whatever address it listens on."""

import os
import subprocess
import sys

import pytest

from gputap_lab.ports import listening_inodes, tree_listens_on, tree_root
from tests.platform import free_port
from tests.waiting import wait_for

LISTEN = "import socket, sys, time; s = socket.socket(socket.{family}); s.bind(('{host}', {port}));"
LISTEN += " s.listen(); print('up', flush=True); time.sleep(60)"


@pytest.fixture
def listener():
    started = []

    def start(host="127.0.0.1", family="AF_INET"):
        port = free_port()
        code = LISTEN.format(family=family, host=host, port=port)
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        started.append(proc)
        assert proc.stdout.readline().strip() == "up"
        return proc, port

    yield start
    for proc in started:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize(
    "host,family", [("127.0.0.1", "AF_INET"), ("0.0.0.0", "AF_INET"), ("::1", "AF_INET6")]
)
def test_a_port_a_child_listens_on_is_the_trees(listener, host, family):
    proc, port = listener(host, family)
    assert listening_inodes(port)
    assert tree_listens_on(os.getpid(), port)
    assert tree_listens_on(proc.pid, port)


def test_a_port_another_tree_listens_on_is_not(listener):
    other, port = listener()
    sibling, _ = listener()
    # the sibling's tree (itself) holds no socket on the other's port
    assert not tree_listens_on(sibling.pid, port)


def test_a_port_nothing_listens_on_is_no_ones(listener):
    proc, port = listener()
    proc.kill()
    proc.wait()
    wait_for(lambda: not listening_inodes(port), "the socket closed")
    assert not tree_listens_on(os.getpid(), port)


def test_the_tree_starts_at_the_reaper_only_when_it_is_the_parent(monkeypatch):
    monkeypatch.setenv("GPUTAP_REAPER_PID", str(os.getppid()))
    assert tree_root() == os.getppid()
    monkeypatch.setenv("GPUTAP_REAPER_PID", "1" if os.getppid() != 1 else "2")
    assert tree_root() == os.getpid()
    monkeypatch.delenv("GPUTAP_REAPER_PID")
    assert tree_root() == os.getpid()
