"""``gputap.workers()`` / ``gputap.scale()`` as a notebook shows them: the group's workers and
their states, never the token their agents want (a cell's Out[...] is saved in the .ipynb)."""

from __future__ import annotations

import secrets

from IPython.lib.pretty import pretty

from gputap.group import Group

TOKEN = secrets.token_urlsafe(24)


def group() -> Group:
    return Group.from_view(
        {
            "workers": [
                {"name": "w1", "state": "ready", "host": "10.1.0.4", "port": 8790},
                {"name": "w2", "state": "starting", "host": None, "port": None},
            ],
            "rendezvous_host": "10.1.0.2",
            "token": TOKEN,
            "price_per_hour": "1.80",
        }
    )


def test_a_group_shown_in_a_notebook_names_its_workers_not_its_token():
    shown = group()
    assert shown.token == TOKEN  # gputap.run still has it
    for text in (repr(shown), str(shown), pretty(shown)):
        assert TOKEN not in text and "token" not in text
        assert "w1" in text and "ready" in text and "w2" in text and "starting" in text
    assert "1.80/h" in pretty(shown)


def test_an_empty_group_says_so():
    empty = Group.from_view({"token": TOKEN})
    assert TOKEN not in repr(empty) and "no workers" in pretty(empty)
