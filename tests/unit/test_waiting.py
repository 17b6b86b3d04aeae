"""The tests' one polling loop (tests/waiting.py): what it returns, and how it fails."""

import itertools
import time

import pytest

from tests.waiting import wait_for, wait_for_async


def test_it_returns_the_first_truthy_value():
    answers = iter([None, [], {"pod": "ada"}, "never asked"])
    assert wait_for(lambda: next(answers), "ada's pod", timeout=1, step=0.01) == {"pod": "ada"}


def test_it_fails_naming_what_it_waited_for_and_the_last_value():
    counter = itertools.count()
    start = time.monotonic()
    with pytest.raises(AssertionError) as failed:
        wait_for(lambda: next(counter) and 0, "ada's pod bound", timeout=0.2, step=0.05)
    assert time.monotonic() - start >= 0.2
    assert str(failed.value) == "not within 0.2s (last value 0): ada's pod bound"


def test_a_callable_what_is_asked_only_when_the_wait_fails():
    seen: list[str] = []
    with pytest.raises(AssertionError) as failed:
        wait_for(lambda: seen.append("asked"), lambda: f"said {seen}", timeout=0.1, step=0.05)
    assert len(seen) >= 2  # asked at the start, and again at the deadline
    assert str(failed.value).endswith(f"said {seen}")  # the list as it was at the failure


def test_a_timeout_given_where_what_goes_is_refused():
    with pytest.raises(TypeError, match="what: words or a function"):
        wait_for(lambda: True, 5)


async def test_the_async_form_awaits_a_coroutine_predicate():
    answers = iter([0, 0, "running"])

    async def phase():
        return next(answers)

    assert await wait_for_async(phase, "the pod running", timeout=1, step=0.01) == "running"
    with pytest.raises(AssertionError, match=r"not within 0.1s \(last value None\): nothing"):
        await wait_for_async(lambda: None, "nothing", timeout=0.1)


def test_a_long_wait_asks_less_often_up_to_half_a_second():
    asked: list[float] = []
    with pytest.raises(AssertionError):
        wait_for(lambda: asked.append(time.monotonic()), "nothing", timeout=3, step=0.05)
    pauses = [b - a for a, b in itertools.pairwise(asked)]
    assert pauses[0] < 0.1  # quick at first
    assert max(pauses[:-1]) <= 0.5 + 0.1  # never longer than half a second (the last: the deadline)
    assert 8 <= len(asked) <= 20  # 60 at a steady 0.05 s
    # a step longer than half a second is kept
    asked.clear()
    with pytest.raises(AssertionError):
        wait_for(lambda: asked.append(time.monotonic()), "nothing", timeout=1.6, step=0.8)
    assert len(asked) == 3
