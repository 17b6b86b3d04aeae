"""A server start's options read the same whether JupyterHub 6 unwrapped its request body or
JupyterHub 5 (the chart's hub image) passed the whole body on (spawner/lifecycle/request_body)."""

import pytest

from spawner.core.placement import RequestError
from spawner.lifecycle.request_body import start_options

A100 = {"kind": "card", "card": "A100-80GB", "count": 2}


@pytest.mark.parametrize(
    "body",
    [
        A100,  # the options themselves: JupyterHub 6 unwrapped them, or the client sent them bare
        {"user_options": A100},  # JupyterHub 6's body, passed on whole by JupyterHub 5
        {"user_options": A100, "display_name": "training"},
    ],
)
def test_the_options_are_the_same_however_the_hub_passed_the_body(body):
    assert start_options(body) == A100


@pytest.mark.parametrize("body", [None, {}, {"user_options": None}, {"user_options": {}}])
def test_no_options_are_empty_options(body):
    assert start_options(body) == {}


def test_an_option_that_happens_to_be_named_user_options_beside_others_is_left_alone():
    body = {"kind": "cpu", "user_options": {"kind": "card"}}
    assert start_options(body) == body


def test_wrapped_options_that_are_no_object_are_refused_as_jupyterhub_6_refuses_them():
    with pytest.raises(RequestError, match="user_options must be an object or null"):
        start_options({"user_options": ["card"]})


def test_the_older_profile_key_is_renamed_inside_the_wrapping_too():
    body = {"user_options": {"kind": "slice", "card": "A100-80GB", "profile": "1g.10gb"}}
    assert start_options(body) == {"kind": "slice", "card": "A100-80GB", "mig_profile": "1g.10gb"}
