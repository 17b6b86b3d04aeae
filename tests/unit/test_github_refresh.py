"""Which requests keep the stale state when a GitHub refresh needs a new login
(hub_config.github_auth.asks_no_login): only the user's own browser can be sent to log in,
on JupyterHub 5 (the chart's hub) as on 6, which decides this itself."""

from types import SimpleNamespace

import pytest

from hub_config.github_auth import asks_no_login

RITA, ADMIN = SimpleNamespace(name="rita"), SimpleNamespace(name="admin")
LENIENT, STRICT = SimpleNamespace(), SimpleNamespace(auth_refresh_strict=True)


def handler(**attributes):
    return SimpleNamespace(**{"_token_authenticated": False, **attributes})


@pytest.mark.parametrize(
    "request_handler, kept",
    [
        (handler(_token_authenticated=True), True),  # a server's (or the user's) API token
        (handler(_jupyterhub_user=ADMIN), True),  # an admin starting rita's server
        (handler(), False),  # rita's browser on JupyterHub 5: not yet named the requester
        (handler(_jupyterhub_user=RITA), False),  # rita's browser on JupyterHub 6
        (None, False),  # no request: nothing to keep going
    ],
)
def test_only_the_users_own_browser_is_sent_to_log_in(request_handler, kept):
    assert asks_no_login(LENIENT, RITA, request_handler) is kept


def test_strict_refresh_keeps_nothing():
    assert asks_no_login(STRICT, RITA, handler(_token_authenticated=True)) is False
