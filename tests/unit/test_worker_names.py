"""The one rule for a scale-out worker's name, which the hub gives and billing checks."""

import pytest

from gputap_common.names import WORKER_NAME, is_worker_name, worker_label


@pytest.mark.parametrize("name", ["w1", "w9", "w10", "w64", "w999"])
def test_workers_are_w1_to_w999(name):
    assert is_worker_name(name) and WORKER_NAME.fullmatch(name)


@pytest.mark.parametrize(
    "name", ["", "w", "w0", "w01", "w1000", "W1", "w-1", "w1\n", " w1", "worker1", None, 1]
)
def test_anything_else_is_no_worker(name):
    assert not is_worker_name(name)


def test_a_worker_is_logged_under_its_server():
    assert worker_label("ada", "", "w2") == "ada#w2"
    assert worker_label("ada", "gpu", "w2") == "ada/gpu#w2"
    assert worker_label("ada", "gpu", "") == "ada/gpu"
