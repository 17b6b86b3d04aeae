"""Drive the stand-in's web flow with `requests`, as a browser would: follow redirects to
the choose-a-user page, click the user's link, follow the redirects back to the app."""

from __future__ import annotations

import html
import re
from urllib.parse import urljoin

import requests


def user_link(page: str, login: str) -> str:
    """The href of a user's link on the stand-in's choose-a-user page."""
    match = re.search(rf'<a class="user" id="login-{re.escape(login)}" href="([^"]+)"', page)
    if match is None:
        raise AssertionError(f"no link for {login} on the page:\n{page[:2000]}")
    return html.unescape(match.group(1))


def sign_in(session: requests.Session, start_url: str, login: str) -> requests.Response:
    """GET start_url (e.g. the hub's /hub/oauth_login), pick `login` on the stand-in's page,
    and return the response at the end of the redirects back."""
    page = session.get(start_url, timeout=30)
    assert page.status_code == 200 and "GitHub stand-in" in page.text, (page.url, page.text)
    return session.get(urljoin(page.url, user_link(page.text, login)), timeout=60)
