"""Each user's server and apps on an origin of their own (docs/security.md, "Origins").

A user's app at ``/user/alice/proxy/8080/`` is alice's page. Under the hub's own origin that
page could read the hub's pages (and their XSRF token) as whoever opens it, an admin
included, and make API tokens in their name. With JupyterHub's ``subdomain_host`` alice's
server answers at ``alice.HOST`` instead: the browser keeps the hub's cookies and pages
away from it. gputap turns it on wherever it can name a host (``hub.subdomain_host``), keeps
its own services (billing) on the hub's host, and refuses GitHub login under one shared
origin unless the settings say every user is trusted.

The hub still answers every host (JupyterHub routes unknown hosts to it, so a stopped
server's page is the hub's "not running" page): its login pages send a browser on a user's
host back to the hub's own host, so no hub login cookie is ever set where a user's app runs.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from jupyterhub.utils import subdomain_hook_idna

from gputap_common.settings import SettingsError

from .github import is_loopback

AUTO = "auto"


def checked_host(value: str) -> str:
    """``value`` as JupyterHub's subdomain_host (scheme and host, no path), or a
    SettingsError saying what is wrong."""
    parts = urlsplit(value)
    if (
        parts.scheme not in ("http", "https")
        or not parts.hostname
        or parts.path not in ("", "/")
        or parts.query
        or parts.fragment
        or parts.username
    ):
        raise SettingsError(
            "hub.subdomain_host must be a URL such as https://gputap.example.org (scheme and "
            "host only; users' servers get https://NAME.gputap.example.org), 'auto' or empty"
        )
    return f"{parts.scheme}://{parts.netloc}"


def subdomain_host(hub: dict[str, Any], chart_host: str = "", on_chart: bool = False) -> str:
    """The subdomain_host ``hub`` settings ask for, '' for none. ``auto``: the chart's own
    (``chart_host``), else on one machine ``http://localhost:PORT`` when the hub listens on
    loopback only (browsers resolve ``*.localhost`` to loopback)."""
    value = hub["subdomain_host"].strip()
    if value != AUTO:
        return checked_host(value) if value else ""
    if chart_host:
        return checked_host(chart_host)
    if not on_chart and is_loopback(hub["ip"]):
        return f"http://localhost:{hub['port']}"
    return ""


def refuse_shared_origin(host: str, github_login: bool, trusted: bool) -> None:
    """GitHub login lets strangers in: with every server on the hub's origin one of them
    could act as whoever opens their app. Refused unless ``trusted``."""
    if host or not github_login or trusted:
        return
    raise SettingsError(
        "GitHub login with every server on the hub's own origin lets a user's app act as "
        "whoever opens it (an admin included). Set hub.subdomain_host to the hub's URL, e.g. "
        "https://gputap.example.org with *.gputap.example.org resolving to it (on the Helm "
        "chart: jupyterhub.hub.config.JupyterHub.subdomain_host), or hub.all_users_trusted: "
        "true if every user is trusted."
    )


def users_apart_services_home(name: str, domain: str, kind: str) -> str:
    """JupyterHub's subdomain hook: a user's servers at ``NAME.domain`` (JupyterHub's own
    IDNA rule), gputap's services (billing) on the hub's host, where its pages link to them."""
    if kind == "service":
        return domain
    return subdomain_hook_idna(name, domain, kind)


def configure_origins(c: Any, host: str) -> None:
    """Put servers on subdomains of ``host`` ('' leaves one origin)."""
    if not host:
        return
    c.JupyterHub.subdomain_host = host
    c.JupyterHub.subdomain_hook = users_apart_services_home


class HubHostOnly:
    """A login handler mixin: on a host other than the hub's (a user's subdomain), send the
    browser to the same path on the hub's host before anything is shown or set."""

    def prepare(self):
        host = self.settings.get("subdomain_host", "")
        if host and self.request.host.lower() != urlsplit(host).netloc.lower():
            self.redirect(host + self.request.uri)
            return None
        return super().prepare()


def hub_host_only(handlers: list[tuple]) -> list[tuple]:
    """``handlers`` (an authenticator's) with each class made :class:`HubHostOnly`."""
    return [
        (pattern, type(cls.__name__, (HubHostOnly, cls), {}), *rest)
        for pattern, cls, *rest in handlers
    ]
