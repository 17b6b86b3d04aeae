"""GitHub login: validated ``hub.github`` settings -> GitHubOAuthenticator configuration.

Teams reach ``auth_state`` and become JupyterHub groups named ``org:team`` (lower case);
``admin_teams`` are JupyterHub admins; ``allowed_organizations`` (organizations or
``org:team``) restrict sign-up, else any GitHub user may sign up. auth_state (which holds the
user's GitHub token) is encrypted with ``JUPYTERHUB_CRYPT_KEY``, else the keys the hub was
configured with (z2jh's, from its Secret), else a key kept in ``hub.crypt_key_file``. See
docs/github.md.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import re
import secrets
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from gputap_common.settings import SettingsError, validated
from gputap_common.settings.names import github_name_list

log = logging.getLogger("gputap.config")


def configure_github(
    c: Any, github: dict[str, Any], hub: dict[str, Any], instructor_teams: list[str] = ()
) -> None:
    """Fill ``c`` for GitHub login from validated settings (see :func:`github_settings`);
    ``instructor_teams`` (courses.instructor_teams) name organizations gputap watches."""
    # GitHubOAuthenticator telling GitHub's failures and restrictions apart (github_auth.py);
    # it reads c.GitHubOAuthenticator as its base class's configuration
    c.JupyterHub.authenticator_class = "hub_config.github_auth.GPUTapGitHubOAuthenticator"
    gh = c.GitHubOAuthenticator
    gh.client_id = github["client_id"]
    gh.client_secret = github["client_secret"]
    gh.login_service = github["login_service"]
    if github["callback_url"]:
        gh.oauth_callback_url = github["callback_url"]
    gh.github_url = github["url"] or "https://github.com"
    gh.github_api = github["api_url"]
    # read:org shows private organization and team membership, not just public membership
    gh.scope = ["read:org"]
    gh.populate_teams_in_auth_state = True
    gh.enable_auth_state = True
    gh.manage_groups = True
    gh.auth_state_groups_key = github_team_groups
    if github["allowed_organizations"]:
        gh.allowed_organizations = set(github["allowed_organizations"])
        gh.custom_403_message = (
            "This hub is open to members of the GitHub organizations or teams "
            f"{', '.join(github['allowed_organizations'])} only, and your GitHub account is "
            "not one of them. Ask an owner to add you, or sign out of GitHub and sign in "
            "with an account that is a member."
        )
    else:
        gh.allow_all = True
    if github["admin_teams"]:
        gh.admin_groups = set(github["admin_teams"])
    timeout = float(github["request_timeout_seconds"])
    gh.http_request_kwargs = {"request_timeout": timeout, "connect_timeout": timeout}
    c.Authenticator.auth_refresh_age = github["refresh_seconds"]
    gputap = c.GPUTapGitHubOAuthenticator
    gputap.refresh_grace_seconds = github["refresh_grace_seconds"]
    gputap.watched_organizations = {
        name.split(":", 1)[0].lower()
        for name in [*github["allowed_organizations"], *github["admin_teams"], *instructor_teams]
    }
    c.JupyterHub.template_vars = {**c.JupyterHub.get("template_vars", {}), "gputap_github": True}
    # JUPYTERHUB_CRYPT_KEY, when set, is read by JupyterHub itself (and may rotate keys);
    # keys already configured are z2jh's, from its Secret `hub` (kept across upgrades), which
    # a file on the hub pod's disk must not replace: without a volume there it would be lost
    # with the pod, and every user's GitHub token with it
    if not os.environ.get("JUPYTERHUB_CRYPT_KEY") and not c.CryptKeeper.get("keys"):
        c.CryptKeeper.keys = [ensure_crypt_key(Path(hub["crypt_key_file"]))]


def github_team_groups(auth_state: dict[str, Any]) -> list[str]:
    """auth_state_groups_key: the user's GitHub teams as JupyterHub groups ``org:team``.

    GitHub names are case-insensitive; groups are lower case so that ``admin_teams``
    and course bindings match whatever case an organization's login is shown in. A member
    of a child team is a member of its parents, as GitHub's member endpoints count them:
    the ancestors found at login (``gputap_parent_teams``) are groups too.
    """
    teams = [*(auth_state.get("teams") or []), *(auth_state.get("gputap_parent_teams") or [])]
    return sorted({f"{team['organization']['login']}:{team['slug']}".lower() for team in teams})


def github_settings(hub: dict[str, Any]) -> dict[str, Any] | None:
    """The ``hub.github`` section checked (keys and types by the settings schema; here what
    the schema cannot say), or None when GitHub login is off (no client_id). Team names are
    kept in lower case (gputap_common/github_names.py); ``api_url`` is resolved."""
    github = validated("hub.github", hub.get("github") or {})
    if not github["client_id"]:
        return None
    if not github["client_secret"]:
        raise SettingsError(
            "hub.github.client_secret must be set with client_id (the OAuth app's secret)"
        )
    url = github["url"].rstrip("/")
    api_url = github["api_url"].rstrip("/") or default_api_url(url)
    for key, value in (
        ("url", url),
        ("api_url", api_url),
        ("callback_url", github["callback_url"]),
    ):
        refuse_plain_http(key, value)
    return {
        **github,
        "url": url,
        "api_url": api_url,
        "allowed_organizations": github_name_list(
            "hub.github.allowed_organizations", github["allowed_organizations"]
        ),
        "admin_teams": github_name_list("hub.github.admin_teams", github["admin_teams"]),
    }


def default_api_url(url: str) -> str:
    """GitHub's REST API for the web ``url``: api.github.com for github.com (or empty),
    api.SUB.ghe.com for GitHub Enterprise Cloud with data residency (SUB.ghe.com), else
    GitHub Enterprise Server's ``{url}/api/v3``."""
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    if not url or host == "github.com":
        return "https://api.github.com"
    if re.fullmatch(r"[a-z0-9-]+\.ghe\.com", host) and parts.path in ("", "/"):
        return f"{parts.scheme}://api.{host}" + (f":{parts.port}" if parts.port else "")
    return f"{url}/api/v3"


#: what would travel unencrypted to each URL over plain http
_PLAIN_HTTP_CARRIES = {
    "url": "the OAuth app's client secret",
    "api_url": "users' GitHub tokens",
    "callback_url": "the login's code and the hub's cookies",
}


def refuse_plain_http(key: str, url: str) -> None:
    """Refuse an ``http://`` URL of ``hub.github.KEY`` unless its host is this machine."""
    parts = urlsplit(url)
    if parts.scheme != "http" or is_loopback(parts.hostname or ""):
        return
    raise SettingsError(
        f"hub.github.{key} {url} is plain http: {_PLAIN_HTTP_CARRIES[key]} would travel "
        "unencrypted; use https:// (http:// only on a loopback address: 127.0.0.1, ::1, "
        "localhost)"
    )


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address) is this machine's loopback."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def ensure_crypt_key(path: Path) -> str:
    """The auth_state encryption key kept in ``path``; created (32 random bytes, hex, mode
    0600) when missing. A key others can read, or one that is not a key, is refused."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        pass
    else:
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32) + "\n")
        log.info("created the auth_state encryption key %s", path)
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        raise SettingsError(
            f"{path} holds the key that encrypts users' GitHub tokens but others may read it "
            f"(mode {mode:o}); run: chmod 600 {path}"
        )
    key = path.read_text().strip()
    if not re.fullmatch(r"[0-9a-fA-F]{64}", key):
        raise SettingsError(
            f"{path} is not a 32-byte hex key; delete it to have a new one made "
            "(users then sign in again) or put `openssl rand -hex 32` in it"
        )
    return key
