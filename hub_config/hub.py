"""Turn gputap settings into JupyterHub configuration.

``jupyterhub_config.py`` calls :func:`apply` with the loaded settings; the same function
serves `make demo`, the tests and (later) the Helm chart's hub image.
"""

from __future__ import annotations

import logging
import os
import secrets
import sys
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from gputap_common import scopes
from gputap_common.settings import Settings, SettingsError
from spawner.core.apps import check_apps
from spawner.core.catalog import load_catalog
from spawner.core.environments import environments_from_settings
from spawner.kube.homes import KUBE_HOME
from spawner.lifecycle import faults
from spawner.local.environments import NoSingleuser, singleuser_of
from spawner.local.machine import DeviceSource
from spawner.local.machine import start_health_watch as start_local
from spawner.local.pool import pool_limits, python_of, static_env, warm_pool
from spawner.local.reaper import reaper_command
from spawner.local.spawner import DEFAULT_INVENTORY_FILE

from . import origins
from .github import configure_github, github_settings
from .github_members import configure_member_watch
from .server_users import servers_run_as
from .shared_data import configure_shared_data
from .with_hub import with_hub

ROOT = Path(__file__).resolve().parent.parent
TEMPLATES = Path(__file__).resolve().parent / "templates"
#: what a single-user server's own token ($JUPYTERHUB_API_TOKEN) may do: JupyterHub's default
#: server role (post activity, be accessed), and for the Lab extension read and change its own
#: server and manage its user's disks (docs/lab.md). "!server" means this server, "!user" its
#: user; the token gets only what the user holds.
SERVER_TOKEN_SCOPES = [
    "users:activity!user",
    "access:servers!server",
    "read:servers!server",
    "servers!server",
    f"{scopes.DISKS}!user",
]
#: where servers' pods mount the user's home (the single-user image's user's home)
#: options of every cookie the hub, billing and the servers set: SameSite=Lax (Strict would
#: drop the login on the OAuth redirects back from GitHub and on links into the hub)
COOKIE_OPTIONS = {"samesite": "Lax"}
DEV_LOGIN_NOTICE = (
    "Development login: any username, no password is checked. "
    "Set hub.github.client_id and client_secret to log in with GitHub."
)

log = logging.getLogger("gputap.config")


def proxy_command(hub: dict[str, Any]) -> list[str]:
    if hub["proxy_command"]:
        return [str(hub["proxy_command"])]
    return [str(ROOT / "node_modules" / ".bin" / "configurable-http-proxy")]


def _url_path(base_url: str) -> str:
    return "/" + base_url.strip("/") + "/" if base_url.strip("/") else "/"


def billing_url(settings: Settings) -> str:
    """Where the hub reaches the billing service directly (not through the proxy)."""
    base = _url_path(settings.hub["base_url"])
    return f"http://127.0.0.1:{settings.billing['port']}{base}services/billing/"


async def open_billing_account(authenticator, handler, authentication):
    """post_auth_hook: open the user's billing account (with trial credit) at first login."""
    from spawner.lifecycle.billing_client import (
        BillingClient,
        BillingRefused,
        BillingUnavailable,
    )

    spawner_config = authenticator.parent.config.GPUSpawnerMixin
    client = BillingClient(spawner_config.billing_url, spawner_config.billing_token)
    username = authenticator.normalize_username(authentication["name"])
    try:
        # the user's GitHub teams (org:team): billing enrols them in courses bound to those
        await client.open_account(username, list(authentication.get("groups") or []))
    except (BillingUnavailable, BillingRefused) as e:
        # login still works; the account is opened at the first spawn instead
        authenticator.log.warning("billing account for %s not opened at login: %s", username, e)
    return authentication


def private_data_dir(data_dir: Path) -> None:
    """Make the data directory (databases, secrets, logs, homes) private to the hub's user:
    0700. Servers of accounts of their own reach their home and disks in it through a view
    of their own (spawner/local/view.py), never through its permissions. Its files are written
    0600 (jupyterhub_config.py sets the umask)."""
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(data_dir, 0o700)


def billing_settings(settings: Settings) -> dict[str, Any]:
    """What the billing service reads of the settings, and nothing else: no hub secrets
    (GitHub's client secret, service tokens, the hub's own database)."""
    spawner = settings.spawner
    return {
        "data_dir": str(settings.data_dir),
        "billing": settings.billing,
        "spawner": {"backend": spawner["backend"], "kubernetes": spawner["kubernetes"]},
        # the environments a course may pin
        "environments": settings.environments,
    }


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable by the hub's user only (0600, even if it existed)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def apply(c: Any, settings: Settings) -> None:
    """Fill JupyterHub's config object ``c`` from settings."""
    hub = settings.hub
    data_dir = settings.data_dir
    own_uid = servers_run_as(settings.spawner) != "hub"
    private_data_dir(data_dir)
    base_url = _url_path(hub["base_url"])

    c.JupyterHub.ip = hub["ip"]
    c.JupyterHub.port = hub["port"]
    c.JupyterHub.hub_ip = "127.0.0.1"
    c.JupyterHub.hub_port = hub["hub_port"]
    c.JupyterHub.base_url = base_url
    c.JupyterHub.db_url = hub["db_url"]
    c.JupyterHub.cookie_secret_file = hub["cookie_secret_file"]
    c.JupyterHub.pid_file = str(data_dir / "jupyterhub.pid")
    c.ConfigurableHTTPProxy.command = proxy_command(hub)
    c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{hub['proxy_api_port']}"
    c.ConfigurableHTTPProxy.pid_file = str(data_dir / "proxy.pid")

    hub_token = secrets.token_hex(32)
    spawner = settings.spawner
    c.GPUSpawnerMixin.billing_url = billing_url(settings)
    c.GPUSpawnerMixin.billing_token = hub_token
    backend = spawner["backend"]
    if (
        backend == "local"
        and github_settings(hub) is not None
        and not own_uid
        and not spawner["allow_shared_unix_user"]
    ):
        raise SettingsError(
            "GitHub login with the local backend lets anyone with a GitHub account run code as "
            "the hub's own Unix user (reading every home and the databases). Run the hub as "
            "root with spawner.server_user: auto or per_user (a Unix account per user), or set "
            "spawner.run_as_system_user: true, or spawner.allow_shared_unix_user: true if every "
            "user is trusted."
        )
    origins.configure_origins(c, origins.subdomain_host(hub))
    if backend == "local":
        _local_backend(c, spawner)
    else:
        # imported here: the Kubernetes client costs a one-machine hub 0.3-0.5 CPU-s at
        # every start (docs/architecture.md, "Start-up cost")
        from . import kube_backend

        kube_backend.configure(c, spawner["kubernetes"], hub["hub_port"])
    _services(c, settings, hub_token)
    _idle_culler(c, settings.section("idle"), backend)
    apply_shared(c, settings, base_url)


def apply_shared(c: Any, settings: Settings, base_url: str) -> None:
    """What gputap sets alike on one machine (:func:`apply`) and under the Helm chart
    (``hub_config.z2jh.configure``), after the backend, the services and their roles: login,
    cookies, named servers, the spawner's catalog, environments, apps, worker groups, disks,
    shared data, the hub's pages and the servers' API scopes. Where the hub listens, its proxy,
    database and data directory stay with each caller."""
    hub, spawner = settings.hub, settings.spawner
    # the hub's cookies (login, session, XSRF, OAuth state) and, through the spawner's
    # JUPYTERHUB_COOKIE_OPTIONS, the servers' are not sent with cross-site requests other
    # than top-level navigations (docs/security.md); z2jh's own tornado_settings are kept
    c.JupyterHub.tornado_settings = {
        **c.JupyterHub.get("tornado_settings", {}),
        "cookie_options": dict(COOKIE_OPTIONS),
    }
    c.JupyterHub.concurrent_spawn_limit = hub["concurrent_spawn_limit"]
    # several servers per user (each its own card and billing session), one home for all
    c.JupyterHub.allow_named_servers = True
    c.JupyterHub.named_server_limit_per_user = hub["named_server_limit_per_user"]
    # servers keep running (and billing keeps counting) across hub restarts
    c.JupyterHub.cleanup_servers = False
    c.JupyterHub.custom_scopes = dict(scopes.CUSTOM)
    _authentication(c, hub, settings.courses["instructor_teams"])
    c.Spawner.default_url = spawner["default_url"]
    c.Spawner.start_timeout = spawner["start_timeout"]
    c.Spawner.http_timeout = spawner["start_timeout"]
    c.Spawner.poll_interval = spawner["poll_interval_seconds"]
    # GPUSpawnerMixin is in both spawners' class hierarchy
    c.GPUSpawnerMixin.catalog_cards = settings.catalog["cards"]
    c.GPUSpawnerMixin.queue_timeout = spawner["queue_timeout"]
    _hub_pages(c, hub, base_url)
    _server_api_scopes(c)
    _gpu_faults(c, settings)
    _disks(c, spawner["disks"])
    _scale_out(c, settings.section("scale_out"))
    _apps(c, settings.section("apps"), set(settings.environments))
    configure_shared_data(c, settings, KUBE_HOME)
    _environments(c, settings)
    if spawner["backend"] == "kubernetes":
        from . import kube_backend

        kube_backend.configure_shared(c, spawner, load_catalog(settings.catalog["cards"]))
    if spawner["backend"] == "local":
        # the default environment's pool imports while the hub starts: the first start is warm
        limits = pool_limits(spawner["pool"])
        warm_pool(limits, python_of(c.Spawner.cmd[-1]), static_env(c.Spawner.environment))


def _local_backend(c: Any, spawner: dict[str, Any]) -> None:
    c.JupyterHub.spawner_class = "gputap-local"
    venv_bin = str(Path(sys.executable).parent)
    # under the reaper: nothing a server starts outlives it (spawner/local/reaper.py)
    c.Spawner.cmd = [*reaper_command(), str(Path(venv_bin) / "jupyterhub-singleuser")]
    # root only where an operator chose servers as the hub's own user and runs it as root
    as_root = os.geteuid() == 0 and servers_run_as(spawner) == "hub"
    c.Spawner.args = ["--allow-root"] if as_root else []
    extra = {k: str(v) for k, v in spawner["environment"].items()}
    # servers never reach out to the internet: no news feed, no update checks (an operator's
    # own config folders come first)
    config_path = [extra.pop("JUPYTER_CONFIG_PATH", ""), str(ROOT / "hub_config" / "singleuser")]
    c.Spawner.environment = {
        "PATH": os.pathsep.join([venv_bin, "/usr/local/bin", "/usr/bin", "/bin"]),
        "LANG": "C.UTF-8",
        **extra,
        "JUPYTER_CONFIG_PATH": os.pathsep.join(p for p in config_path if p),
    }
    c.GPULocalSpawner.inventory = spawner["inventory"]
    c.GPULocalSpawner.exclude_gpus = spawner["exclude_gpus"]
    c.GPULocalSpawner.inventory_refresh_seconds = spawner["inventory_refresh_seconds"]
    if spawner["inventory_file"]:
        c.GPULocalSpawner.inventory_file = spawner["inventory_file"]
    c.GPULocalSpawner.homes_root = spawner["homes_root"]
    c.GPULocalSpawner.run_as_system_user = spawner["run_as_system_user"]
    c.GPULocalSpawner.server_user = spawner["server_user"]
    c.GPULocalSpawner.server_pool = spawner["pool"]


def _environments(c: Any, settings: Settings) -> None:
    """The environment catalog, refused at start-up when it cannot work on this backend: no
    default or two, a default not everyone may use, on one machine an environment whose
    python holds no jupyterhub-singleuser (spawner/core/environments.py)."""
    spawner = settings.spawner
    backend, pattern = spawner["backend"], spawner["kubernetes"]["image_pattern"]
    environments_from_settings(settings.environments, backend, pattern)
    if backend == "local":
        for key, entry in settings.environments.items():
            if entry["python"]:
                try:
                    singleuser_of(entry["python"])
                except NoSingleuser as e:
                    raise SettingsError(f"environments.{key}.python: {e}") from None
    c.GPUSpawnerMixin.environments = settings.environments
    c.GPUSpawnerMixin.image_pattern = pattern


def _disks(c: Any, disks: dict[str, Any]) -> None:
    """Data disks (docs/lab.md): where they live, how many and how big; their API in the hub."""
    c.GPUSpawnerMixin.disk_max_size_gb = disks["max_size_gb"]
    c.GPUSpawnerMixin.max_disks = disks["max_disks"]
    c.GPULocalSpawner.disk_root = disks["root"]
    c.GPUKubeSpawner.disk_storage_class = disks["storage_class"]


def _scale_out(c: Any, scale_out: dict[str, Any]) -> None:
    """Worker groups (docs/scale-out.md): how many per server, how long one may idle."""
    c.GPUSpawnerMixin.max_workers = scale_out["max_workers"]
    c.GPUSpawnerMixin.worker_idle_seconds = scale_out["idle_seconds"]


def _apps(c: Any, apps: dict[str, Any], environments: set[str]) -> None:
    """Apps in the servers (docs/lab.md, "Apps"): checked now, so a bad one stops the hub
    rather than failing in every server (an app for an environment there is not, too); each
    server gets those of its environment."""
    check_apps(apps, environments)
    c.GPUSpawnerMixin.apps = apps


def _hub_pages(c: Any, hub: dict[str, Any], base_url: str) -> None:
    """The hub's own gputap handlers (the spec preview, the user's account, running servers),
        gputap's links and the credit banner on every hub page (templates/page.html extends
        JupyterHub's page.html), the running servers on the home and admin pages, and the admin
    page's form that moves a renamed user's account."""
    from spawner import api

    c.JupyterHub.extra_handlers = list(api.default_handlers)
    c.JupyterHub.template_paths = [str(TEMPLATES)]
    c.JupyterHub.template_vars = {
        **c.JupyterHub.get("template_vars", {}),  # the login notice, if any
        "gputap_account_url": f"{base_url}hub/{api.account.ACCOUNT_PATH}",
        "gputap_running_url": f"{base_url}hub/{api.running.RUNNING_PATH}",
        "gputap_move_url": f"{base_url}hub/{api.admin.MOVE_PATH}",
        "gputap_gpus_url": f"{base_url}hub/{api.gpus.GPUS_PATH}",
        "gputap_gpu_faults_url": f"{base_url}hub/{api.gpus.FAULTS_PATH}",
        "gputap_billing_url": f"{base_url}services/billing/",
        "gputap_billing_admin_scope": scopes.BILLING_ADMIN,
        "gputap_credit_refresh_seconds": float(hub["credit_banner_refresh_seconds"]),
    }


def _authentication(c: Any, hub: dict[str, Any], instructor_teams: list[str]) -> None:
    github = github_settings(hub)
    origins.refuse_shared_origin(
        c.JupyterHub.get("subdomain_host", ""), github is not None, hub["all_users_trusted"]
    )
    c.Authenticator.admin_users = set(hub["admin_users"])
    c.Authenticator.post_auth_hook = open_billing_account
    notice = hub["login_notice"]
    if github is None:
        c.JupyterHub.authenticator_class = "hub_config.dev_login.DevLoginAuthenticator"
        c.Authenticator.allow_all = True
        # the development login is always labelled as such, whatever else the notice says
        c.JupyterHub.template_vars = {"announcement_login": f"{DEV_LOGIN_NOTICE} {notice}".strip()}
        return
    configure_github(c, github, hub, instructor_teams)
    if github["allowed_organizations"]:
        # removed members' running servers stop within the refresh (github_members.py)
        configure_member_watch(c, github["refresh_seconds"], _hub_api_url(c))
    if notice:
        c.JupyterHub.template_vars = {
            **c.JupyterHub.get("template_vars", {}),
            "announcement_login": notice,
        }


def _billing_service(billing: dict[str, Any], environment: dict[str, str]) -> dict[str, Any]:
    """The billing service: started by the hub, or (``billing.managed: false``) run by the
    operator with ``billing.api_token``, so that it outlives hub restarts and the hub
    never restarts it (docs/billing.md, "Running billing outside the hub")."""
    service: dict[str, Any] = {
        "name": "billing",
        "url": f"http://127.0.0.1:{billing['port']}",
        "oauth_no_confirm": True,
        "oauth_client_allowed_scopes": [scopes.BILLING_ADMIN, scopes.BILLING_INSTRUCTOR],
    }
    if billing["managed"]:
        # it dies with the hub (hub_config/with_hub.py), so the next hub owns the port
        service["command"] = [*with_hub(), sys.executable, "-m", "billing_service"]
        service["environment"] = environment
        return service
    if not billing["api_token"]:
        raise SettingsError(
            "billing.managed: false needs billing.api_token, the token the billing service "
            "runs with (its JUPYTERHUB_API_TOKEN); e.g. the output of `openssl rand -hex 32`"
        )
    service["api_token"] = billing["api_token"]
    return service


def people_roles(settings: Settings) -> list[dict[str, Any]]:
    """Billing's admins (the hub's admin users and admin teams) and instructors (the
    configured ones and instructor teams), the same on one machine and on the chart."""
    hub = settings.hub
    return [
        {
            "name": "gputap-billing-admin",
            "description": "Admins see every account and grant credit",
            "scopes": [scopes.BILLING_ADMIN, scopes.BILLING_ACCESS],
            "users": sorted(hub["admin_users"]),
            "groups": sorted((github_settings(hub) or {}).get("admin_teams") or []),
        },
        {
            "name": "gputap-instructor",
            "description": "Instructors create and run their courses",
            "scopes": [scopes.BILLING_INSTRUCTOR, scopes.BILLING_ACCESS],
            "users": sorted(settings.courses["instructors"]),
            "groups": sorted(settings.courses["instructor_teams"]),
        },
    ]


def _services(c: Any, settings: Settings, hub_token: str) -> None:
    hub = settings.hub
    # billing reads its own settings file, resolved (file and GPUTAP__ variables) and written
    # for it alone: neither the operator's whole file nor the hub's environment
    billing_file = settings.data_dir / "billing-settings.yaml"
    write_private(billing_file, yaml.safe_dump(billing_settings(settings), sort_keys=True))
    passthrough = {"GPUTAP_SETTINGS": str(billing_file)}
    if settings.spawner["backend"] == "kubernetes" and os.environ.get("KUBECONFIG"):
        # billing meters the pods with the hub's cluster credentials (docs/billing.md)
        passthrough["KUBECONFIG"] = os.environ["KUBECONFIG"]
    services: list[dict[str, Any]] = [
        _billing_service(settings.billing, passthrough),
        {"name": "gputap-hub", "api_token": hub_token},
    ]
    roles: list[dict[str, Any]] = [
        {
            "name": "user",
            "description": "Everyone: their own servers, and their billing page",
            "scopes": ["self", scopes.BILLING_ACCESS],
        },
        {
            "name": "gputap-hub",
            "description": "The hub's spawner: prices, admission and billing sessions",
            "scopes": [scopes.BILLING_HUB, scopes.BILLING_ACCESS],
            "services": ["gputap-hub"],
        },
        {
            "name": "gputap-billing",
            "description": "Billing: reconcile servers and stop them when credit runs out",
            "scopes": ["list:users", "read:users", "read:servers", "delete:servers"],
            "services": ["billing"],
        },
        *people_roles(settings),
    ]
    for extra in hub["services"]:
        name = extra["name"]
        services.append({"name": name, "api_token": extra["api_token"]})
        roles.append(
            {
                "name": f"service-{name}",
                "scopes": list(extra["scopes"]),
                "services": [name],
            }
        )
    c.JupyterHub.services = services
    c.JupyterHub.load_roles = roles


def _gpu_faults(c: Any, settings: Settings) -> None:
    """The GPU fault desk (docs/gpu-faults.md) and its watchers, started with the hub; its
    recoveries reach the hub's API as the gputap-health service (a token per hub start)."""
    faults_settings = settings.section("faults")
    if not faults_settings["enabled"]:
        faults.setup(faults_settings, settings.data_dir, "")
        return
    c.GPUSpawnerMixin.fault_restart = faults_settings["restart"]
    token = secrets.token_hex(32)
    c.JupyterHub.services.append({"name": faults.HEALTH_SERVICE, "api_token": token})
    c.JupyterHub.load_roles.append(
        {
            "name": faults.HEALTH_SERVICE,
            "description": "The hub's GPU fault desk: stop and start servers hit by a fault",
            "scopes": ["admin:servers"],
            "services": [faults.HEALTH_SERVICE],
        }
    )
    spawner = settings.spawner
    catalog = load_catalog(settings.catalog["cards"])
    if spawner["backend"] == "kubernetes":
        from spawner.kube.machine import start_health_watch as start_kube

        spawner_config = c.KubeSpawner
        api = {
            "host": spawner_config.get("k8s_api_host"),
            "ssl_ca_cert": spawner_config.get("k8s_api_ssl_ca_cert"),
            "verify_ssl": spawner_config.get("k8s_api_verify_ssl"),
        }
        # as the spawners have them (GPUKubeSpawner's own over KubeSpawner's): nodes tainted
        # against them offer nothing
        tolerations = c.GPUKubeSpawner.get("tolerations", spawner_config.get("tolerations")) or []
        start = partial(start_kube, catalog=catalog, api=api, tolerations=tolerations)
    else:
        source = DeviceSource(
            inventory=spawner["inventory"],
            inventory_file=spawner["inventory_file"] or str(DEFAULT_INVENTORY_FILE),
            exclude=tuple(spawner["exclude_gpus"]),
            node=os.uname().nodename,
        )
        start = partial(start_local, source=source, catalog=catalog)
    faults.setup(faults_settings, settings.data_dir, token, start, _hub_api_url(c))


def _hub_api_url(c: Any) -> str:
    """Where the hub's own API answers from inside the hub: the address it binds (loopback
    when it binds every address). Spawners tell the desk the hub's api_url as they run."""
    base = (c.JupyterHub.get("base_url") or "/").rstrip("/")
    bind = c.JupyterHub.get("hub_bind_url")
    if bind:
        parts = urlsplit(bind)
        scheme, host, port = parts.scheme, parts.hostname, parts.port or 8081
    else:
        scheme, host, port = "http", c.JupyterHub.get("hub_ip"), c.JupyterHub.get("hub_port")
    if host in (None, "", "0.0.0.0", "::"):
        host = "127.0.0.1"
    elif ":" in host:
        host = f"[{host}]"
    return f"{scheme}://{host}:{port or 8081}{base}/hub/api"


def _idle_culler(c: Any, idle: dict[str, Any], backend: str, api_url: str | None = None) -> None:
    """jupyterhub-idle-culler as a hub service, and how often servers report activity; it asks
    the hub at ``api_url`` where given (else at the URL JupyterHub gives its services).

    A server's last activity includes its GPU being busy (the gputap-lab server extension
    marks it), so long training runs survive while idle GPUs are stopped (docs/lab.md)."""
    interval = str(idle["activity_interval_seconds"])
    target = c.KubeSpawner if backend == "kubernetes" else c.Spawner
    target.environment = {**target.get("environment", {}), "JUPYTERHUB_ACTIVITY_INTERVAL": interval}
    if not idle["enabled"]:
        return
    c.JupyterHub.services.append(
        {
            "name": "idle-culler",
            "command": [
                *with_hub(),  # one culler per hub, even after the hub was killed
                sys.executable,
                "-m",
                "hub_config.idle_culler",  # jupyterhub_idle_culler, its stops told why
                f"--timeout={idle['timeout_seconds']}",
                f"--cull-every={idle['cull_every_seconds']}",
                *([f"--url={api_url}"] if api_url else []),
            ],
        }
    )
    c.JupyterHub.load_roles.append(
        {
            "name": "idle-culler",
            "description": "Stop servers with neither user nor GPU activity for a while",
            "scopes": ["list:users", "read:users:activity", "read:servers", "delete:servers"],
            "services": ["idle-culler"],
        }
    )


def _server_api_scopes(c: Any) -> None:
    """Scopes of the hub's server API (docs/lab.md): each server's own token may read and
    change that server and manage its user's disks; every user holds the disks scope on
    themselves (a token gets only scopes its owner holds)."""
    c.Spawner.server_token_scopes = list(SERVER_TOKEN_SCOPES)
    for role in c.JupyterHub.load_roles:
        if role["name"] == "user":
            role["scopes"] = [*role["scopes"], f"{scopes.DISKS}!user"]
