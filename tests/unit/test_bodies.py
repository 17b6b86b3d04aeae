"""Request bodies as billing and the hub's gputap API read them (gputap_common/bodies.py):
a body nested deeper than any real one is refused with a sentence saying so, whether or not
it is deep enough to exhaust Python's recursion limit, and nothing of it is echoed."""

import pytest

from gputap_common.bodies import MAX_DEPTH, BodyRefused, json_object


@pytest.mark.parametrize(
    "raw",
    [
        b"[" * 100_000 + b"]" * 100_000,
        b'{"a":' * 5_000 + b"1" + b"}" * 5_000,
        # read without a recursion error, but no real body is a tenth as deep
        b'{"to": ' + b"[" * 900 + b"]" * 900 + b"}",
        b'{"to": ' + b"[" * (MAX_DEPTH) + b"]" * (MAX_DEPTH) + b"}",
    ],
    ids=["list-100000", "object-5000", "value-900", "one-past-the-limit"],
)
def test_a_body_nested_too_deep_is_refused_saying_so(raw):
    with pytest.raises(BodyRefused) as refused:
        json_object(raw, ("to", "a"))
    message = str(refused.value)
    assert f"nested too deep (more than {MAX_DEPTH} levels" in message
    assert "[[" not in message and len(message) < 200


def test_a_body_at_the_depth_limit_is_read():
    raw = b'{"to": ' + b"[" * (MAX_DEPTH - 1) + b"]" * (MAX_DEPTH - 1) + b"}"
    body = json_object(raw, ("to",))
    depth = 1
    value = body["to"]
    while value:
        value, depth = value[0], depth + 1
    assert depth == MAX_DEPTH - 1
    assert json_object(b'{"to": "ok"}', ("to",)) == {"to": "ok"}
