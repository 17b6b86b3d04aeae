from hypothesis import given
from hypothesis import strategies as st

from spawner.core.dirnames import safe_dirname


def test_home_folder_names_are_safe_and_readable():
    assert safe_dirname("alice") == "alice"
    assert safe_dirname("a.b_c") == "a.b_c"
    assert safe_dirname("../etc") == "-2e-.-2f-etc"
    assert safe_dirname("a@b") == "a-40-b"
    assert safe_dirname("a-40-b") == "a-2d-40-2d-b"


@given(st.text(min_size=1), st.text(min_size=1))
def test_different_users_never_share_a_home(a, b):
    if a != b:
        assert safe_dirname(a) != safe_dirname(b)
    name = safe_dirname(a)
    assert "/" not in name and name not in (".", "..") and not name.startswith(".")
