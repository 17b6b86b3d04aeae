"""What GitHub's failing answers mean for a person signing in (pure: no I/O).

`GitHubError` is a tornado ``HTTPError`` whose page (JupyterHub's error.html) says in words
whether GitHub did not answer (503: retry, with the rate limit's reset time when GitHub gave
it) or refused (403: why, and what to do). :func:`classify` turns one GitHub answer into one.
See docs/github.md "When GitHub fails".
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta

from tornado import web

#: GitHub's page on approving an OAuth app for an organization (what an owner must do)
APPROVE_DOCS = (
    "https://docs.github.com/en/organizations/managing-oauth-access-to-your-organizations-data/"
    "approving-oauth-apps-for-your-organization"
)
#: the kinds of failure, with the page's heading
REASONS = {
    "unavailable": "GitHub did not answer",
    "rate_limited": "GitHub's rate limit is used up",
    "refused": "GitHub refused",
    "token_revoked": "GitHub no longer accepts this sign-in",
    "saml": "The organization requires SAML single sign-on",
    "app_restricted": "The organization has not approved gputap",
}
#: kinds that say nothing about the user: asking again later may well succeed
TRANSIENT = frozenset({"unavailable", "rate_limited"})
RETRY_LINK = '<a id="gputap-github-retry" href="oauth_login">Sign in again</a>'
_SSO_URL = re.compile(r"url=(\S+)")


class GitHubError(web.HTTPError):
    """GitHub failed one of the hub's calls; ``kind`` is one of :data:`REASONS`.

    ``jupyterhub_message`` and ``jupyterhub_html_message`` are what JupyterHub's error page
    shows; the retry link is relative, as the page is the hub's /hub/oauth_callback.
    """

    def __init__(
        self,
        kind: str,
        text: str,
        *,
        org: str = "",
        url: str = "",
        retry_at: datetime | None = None,
        status: int | None = None,
    ):
        code = status or (503 if kind in TRANSIENT else 403)
        # no args: the text may hold a % of its own
        super().__init__(code, text.replace("%", "%%"), reason=REASONS[kind])
        self.kind = kind
        self.org = org
        self.url = url
        self.retry_at = retry_at
        self.jupyterhub_message = text

    @property
    def transient(self) -> bool:
        return self.kind in TRANSIENT

    @property
    def jupyterhub_html_message(self) -> str:
        text = html.escape(self.jupyterhub_message)
        if self.kind == "saml" and self.url:
            url = html.escape(self.url)
            text = text.replace(url, f'<a id="gputap-github-sso" href="{url}">{url}</a>')
        elif self.kind == "app_restricted":
            text += f' (<a href="{APPROVE_DOCS}">GitHub: approving OAuth apps</a>)'
        return f"{text} {RETRY_LINK}."


def _message(body: bytes | None) -> str:
    try:
        return str(json.loads(body or b"{}").get("message") or "")
    except (ValueError, AttributeError):
        return ""


def retry_time(headers: Mapping[str, str], now: datetime) -> datetime | None:
    """When GitHub says to ask again: Retry-After (seconds), else X-RateLimit-Reset (epoch)."""
    try:
        if headers.get("Retry-After"):
            return now + timedelta(seconds=int(headers["Retry-After"]))
        if headers.get("X-RateLimit-Reset"):
            return datetime.fromtimestamp(int(headers["X-RateLimit-Reset"]), UTC)
    except ValueError:
        return None
    return None


def unavailable(what: str, detail: str) -> GitHubError:
    """GitHub did not answer at all (timeout, connection refused)."""
    return GitHubError(
        "unavailable",
        f"GitHub did not answer gputap's request for {what} ({detail}). Nothing was changed "
        "on the hub; GitHub may be down or slow: try again in a minute.",
    )


def classify(
    status: int | None,
    headers: Mapping[str, str],
    body: bytes | None,
    what: str,
    now: datetime,
    org: str = "",
) -> GitHubError | None:
    """The failure one GitHub answer is, or None for an answer that is no failure (2xx, 404).

    ``what`` names what was asked ("your teams"), ``org`` the organization the call was
    about (for the SSO and app-approval pages).
    """
    if status is not None and (status < 400 or status == 404):
        return None
    message = _message(body)
    said = f": {message}" if message else ""
    if status is None or status >= 500:
        return unavailable(what, f"it answered {status}{said}" if status else "no answer")
    limited = status == 429 or (
        status == 403
        and (headers.get("X-RateLimit-Remaining") == "0" or "rate limit" in message.lower())
    )
    if limited:
        at = retry_time(headers, now)
        when = (
            f"Try again after {at:%H:%M} UTC ({max(0, int((at - now).total_seconds()))} s)."
            if at
            else "Try again in a few minutes."
        )
        return GitHubError(
            "rate_limited",
            f"GitHub refused gputap's request for {what} for now: the rate limit of requests "
            f"is used up (GitHub answered {status}{said}). {when}",
            retry_at=at,
        )
    if status == 401:
        return GitHubError(
            "token_revoked",
            f"GitHub no longer accepts gputap's access to your account (asking for {what}, it "
            f"answered 401{said}): the app's authorization was revoked. Sign in again.",
        )
    sso = headers.get("X-GitHub-SSO", "")
    if status == 403 and sso.startswith("required"):
        found = _SSO_URL.search(sso)
        url = found.group(1) if found else ""
        where = (
            f"Authorize gputap for {org} at {url}, then sign in again."
            if url
            else (
                f"Authorize gputap for {org} on GitHub (your settings, Applications), then sign "
                "in again."
            )
        )
        return GitHubError(
            "saml",
            f"The GitHub organization {org} requires SAML single sign-on, and your sign-in to "
            f"gputap is not yet authorized for it. {where}",
            org=org,
            url=url,
        )
    if status == 403 and "OAuth App access restrictions" in message:
        return GitHubError(
            "app_restricted",
            f"The GitHub organization {org} has not approved gputap's OAuth app, so GitHub "
            f"does not tell gputap {what}. An owner of {org} must approve the app (on GitHub: "
            f"the organization's Settings, Third-party access, OAuth app policy); you can ask "
            "them from your GitHub settings (Applications, Authorized OAuth Apps, gputap, "
            "Request).",
            org=org,
        )
    return GitHubError(
        "refused",
        f"GitHub refused gputap's request for {what} (it answered {status}{said}).",
    )
