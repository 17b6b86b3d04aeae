"""The time-to-ready sentence (spawner/core/time_to_ready.py): one wording for the spawn page,
the hub's home page and Lab."""

from __future__ import annotations

import pytest

from spawner.core.time_to_ready import TimeToReady, format_start_seconds, ready_event


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (0.517, "0.52 s"),
        (9.994, "9.99 s"),
        (12.44, "12.4 s"),
        (59.9, "59.9 s"),
        (125.4, "2 min 05 s"),
    ],  # fmt: skip
)
def test_seconds_read_as_a_person_would_say_them(seconds, shown):
    assert format_start_seconds(seconds) == shown


def test_a_quick_start_is_one_clause_and_a_queued_one_says_what_it_waited_for():
    assert TimeToReady(0.517).message == "Ready 0.52 s after Start"
    assert TimeToReady(0.9, queued_seconds=0.2).message == "Ready 0.90 s after Start"
    assert TimeToReady(34.1, queued_seconds=21.04).message == (
        "Ready 34.1 s after Start (21.0 s of it waiting in the queue for a GPU)"
    )
    assert TimeToReady(1.0, 0.6).view() == {
        "seconds": 1.0,
        "queued_seconds": 0.6,
        "message": "Ready 1.00 s after Start (0.60 s of it waiting in the queue for a GPU)",
    }
    with pytest.raises(ValueError, match="negative"):
        TimeToReady(-1.0)


def test_the_spawn_pages_last_line_says_how_long_the_start_took():
    event = {"progress": 100, "ready": True, "message": "Server ready at /user/ada/",
             "html_message": 'Server ready at <a href="/user/ada/">/user/ada/</a>'}  # fmt: skip
    shown = ready_event(event, TimeToReady(0.52))
    assert shown["message"] == "Server ready at /user/ada/, 0.52 s after Start"
    assert shown["html_message"].endswith("</a>, 0.52 s after Start")
    assert shown["ready"] is True and event["message"] == "Server ready at /user/ada/"
    assert ready_event(event, None) == event
