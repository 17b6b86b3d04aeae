import pytest

from tests.platform import Platform


@pytest.fixture(scope="module")
def platform(tmp_path_factory):
    p = Platform(tmp_path_factory.mktemp("platform"))
    p.start()
    yield p
    p.shutdown()
