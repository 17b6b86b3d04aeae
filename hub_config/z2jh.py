"""gputap in zero-to-jupyterhub's hub pod: the Helm chart's ``hub.extraConfig`` calls

    from z2jh import get_config
    from gputap_common.settings import exit_on_refusal
    from hub_config.z2jh import configure
    with exit_on_refusal("hub"):
        configure(c, get_config("custom.gputap"))

after z2jh's own ``jupyterhub_config.py``. ``custom.gputap`` holds the same settings as one
machine's settings file (``hub_config/defaults.yaml``), read by the same loader and checks
(``GPUTAP__SECTION__KEY`` variables, e.g. a secret from ``hub.extraEnv``, still override).
z2jh keeps what it owns in the pod: the hub's and proxy's addresses (the hub listens on
0.0.0.0:8081, servers reach it at its Service), the database, the cookie secret, ``base_url``
and ``hub_connect_url`` (unless ``spawner.kubernetes.hub_connect_url`` names another); gputap
sets the rest as on one machine (``hub_config.hub.apply_shared``): its spawner, environments,
apps, worker groups, login, cookies and hub pages.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping
from typing import Any

from gputap_common import scopes
from gputap_common.settings import Settings, SettingsError, settings_from_mapping

from .hub import _idle_culler, _url_path, apply_shared, people_roles
from .kube_backend import configure_spawner
from .origins import configure_origins, subdomain_host

#: how the settings are named in a refusal: where an operator wrote them
ORIGIN = "jupyterhub.custom.gputap"
#: the chart's name (helm/gputap/Chart.yaml), part of the names of its own objects
CHART_NAME = "gputap"


def chart_fullname(release: str) -> str:
    """The chart's ``gputap.fullname`` (templates/_helpers.tpl) for the release ``release``:
    the prefix of its own objects' names (billing's Service, the cluster-scoped
    PriorityClasses)."""
    name = release if CHART_NAME in release else f"{release}-{CHART_NAME}"
    return name[:63].rstrip("-")


def _billing(c: Any, settings: Settings, environ: Mapping[str, str]) -> None:
    """The hub reaches billing, the chart's own Deployment, at its Service; billing's token is
    z2jh's (``hub.services.billing``), the spawner's a fresh one per hub start."""
    release = environ.get("HELM_RELEASE_NAME")
    if not release:
        raise SettingsError(
            "HELM_RELEASE_NAME is not set: gputap's z2jh configuration runs in the hub pod of "
            "the gputap Helm chart, where z2jh sets it"
        )
    url = f"http://{chart_fullname(release)}-billing:{settings.billing['port']}"
    services = [s for s in c.JupyterHub.get("services", []) if s.get("name") == "billing"]
    if not services:
        raise SettingsError(
            "jupyterhub.hub.services.billing is missing: the chart's values.yaml declares it "
            "so that z2jh makes billing's token; keep it when overriding jupyterhub.hub.services"
        )
    services[0].setdefault("url", url)
    token = secrets.token_hex(32)
    base_url = _url_path(c.JupyterHub.get("base_url", "/"))
    c.GPUSpawnerMixin.billing_url = f"{url}{base_url}services/billing/"
    c.GPUSpawnerMixin.billing_token = token
    c.JupyterHub.services.append({"name": "gputap-hub", "api_token": token})
    roles = c.JupyterHub.load_roles
    roles.append(
        {
            "name": "gputap-hub",
            "description": "The hub's spawner: prices, admission and billing sessions",
            "scopes": [scopes.BILLING_HUB, scopes.BILLING_ACCESS],
            "services": ["gputap-hub"],
        }
    )
    roles.extend(people_roles(settings))
    if not any(role["name"] == "user" for role in roles):
        roles.append(
            {
                "name": "user",
                "description": "Everyone: their own servers, and their billing page",
                "scopes": ["self", scopes.BILLING_ACCESS],
            }
        )


def _culler(c: Any, idle: dict[str, Any]) -> None:
    """gputap's idle culler from ``custom.gputap.idle``, whose stops tell users that their
    server was idle and for how long; the chart turns z2jh's own (``jupyterhub.cull``) off,
    and both at once would be two cullers with two timeouts."""
    z2jh_culler = any(s.get("name") == "jupyterhub-idle-culler" for s in c.JupyterHub.services)
    if idle["enabled"] and z2jh_culler:
        raise SettingsError(
            "jupyterhub.cull.enabled is true and custom.gputap.idle.enabled too: two idle "
            "cullers would stop servers by two timeouts. Set jupyterhub.cull.enabled: false "
            "(gputap's culler reads custom.gputap.idle and tells users why a server stopped)"
        )
    base_url = _url_path(c.JupyterHub.get("base_url", "/"))
    # in the hub's own pod, as z2jh's culler asks it
    _idle_culler(c, idle, "kubernetes", api_url=f"http://localhost:8081{base_url}hub/api")


def chart_settings(raw: Mapping[str, Any] | None, environ: Mapping[str, str]) -> Settings:
    """``custom.gputap`` checked and completed; the servers' namespace defaults to the hub's
    own (z2jh's ``POD_NAMESPACE``), as z2jh's own KubeSpawner configuration does, and the
    PriorityClasses to those the chart creates for the release (z2jh's ``HELM_RELEASE_NAME``)."""
    data = dict(raw or {})
    kube = dict((data.get("spawner") or {}).get("kubernetes") or {})
    if not kube.get("namespace") and environ.get("POD_NAMESPACE"):
        kube["namespace"] = environ["POD_NAMESPACE"]
    if environ.get("HELM_RELEASE_NAME"):
        prefix = chart_fullname(environ["HELM_RELEASE_NAME"])
        classes = dict(kube.get("priority_classes") or {})
        for key, suffix in (("on_demand", "on-demand"), ("spot", "spot")):
            classes[key] = classes.get(key) or f"{prefix}-{suffix}"
        kube["priority_classes"] = classes
    if kube:
        data["spawner"] = {**(data.get("spawner") or {}), "kubernetes": kube}
    settings = settings_from_mapping(data, ORIGIN, environ)
    if settings.spawner["backend"] != "kubernetes":
        raise SettingsError(
            f"{ORIGIN}: spawner.backend is {settings.spawner['backend']!r}; the Helm chart runs "
            "servers on Kubernetes, so set spawner.backend: kubernetes (or leave it out)"
        )
    if settings.spawner["kubernetes"]["hub_ip"]:
        # z2jh binds the hub (hub_bind_url http://:8081, which wins over hub_ip) and tells
        # servers its Service (hub_connect_url http://hub:8081): a hub_ip here would do nothing
        raise SettingsError(
            f"{ORIGIN}: spawner.kubernetes.hub_ip is for a hub on a machine of its own; under "
            "the Helm chart the hub listens on 0.0.0.0:8081 and pods reach it at its Service, "
            "so leave hub_ip out"
        )
    return settings


def _same_server_user(c: Any, kube: Mapping[str, Any]) -> None:
    """z2jh sets KubeSpawner's uid and fs_gid from singleuser.uid / singleuser.fsGid before
    gputap sets them from its own settings: refuse the two when they differ, rather than let
    one silently win."""
    for trait, z2jh_key in (("uid", "singleuser.uid"), ("fs_gid", "singleuser.fsGid")):
        theirs = c.KubeSpawner.get(trait)
        if theirs is not None and theirs != kube[trait]:
            raise SettingsError(
                f"jupyterhub.{z2jh_key} is {theirs} but {ORIGIN}.spawner.kubernetes.{trait} is "
                f"{kube[trait]}: servers run as one user (the single-user image's); set both "
                "to the same value"
            )


def configure(
    c: Any, raw: Mapping[str, Any] | None, environ: Mapping[str, str] | None = None
) -> Settings:
    """Fill JupyterHub's config ``c`` (already filled by z2jh) from ``custom.gputap``."""
    environ = os.environ if environ is None else environ
    settings = chart_settings(raw, environ)
    kube = settings.spawner["kubernetes"]
    _same_server_user(c, kube)
    configure_spawner(c, kube)
    if not isinstance(c.JupyterHub.get("load_roles"), list):
        c.JupyterHub.load_roles = []
    _billing(c, settings, environ)
    _culler(c, settings.section("idle"))
    chart_host = c.JupyterHub.get("subdomain_host", "")
    configure_origins(c, subdomain_host(settings.hub, chart_host, on_chart=True) or chart_host)
    apply_shared(c, settings, _url_path(c.JupyterHub.get("base_url", "/")))
    return settings
