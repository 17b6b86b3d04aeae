"""The billing web application: wiring of settings, store, handlers, enforcement, reconciliation
and (on Kubernetes) the pod meter."""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlparse

from jupyterhub.services.auth import HubOAuth
from tornado import web

from gputap_common import clock
from gputap_common.settings import validated

from .config import BillingConfig, load_billing_config, load_billing_settings
from .handlers.fields import MAX_STREAM_BYTES
from .handlers.routes import make_handlers
from .loops.charge import Charger, charge_pass
from .loops.enforce import Enforcer
from .loops.reconcile import Reconciler
from .migrate import open_database
from .store import Store

if TYPE_CHECKING:
    from .loops.kube_meter import KubeMeter

log = logging.getLogger("billing")

TEMPLATES = Path(__file__).with_name("templates")
#: every cookie billing sets (its login, OAuth state and XSRF cookies): not sent with
#: cross-site requests other than top-level navigations (docs/security.md)
COOKIE_OPTIONS = {"samesite": "Lax"}


def log_request(handler: web.RequestHandler) -> None:
    """Access log without query strings (they may name users or carry ?token=)."""
    status = handler.get_status()
    level = logging.INFO if status < 400 else logging.WARNING if status < 500 else logging.ERROR
    request = handler.request
    log.log(
        level,
        "%s %s %s %.1fms",
        status,
        request.method,
        request.path,
        1000 * request.request_time(),
    )


#: where the chart hands every billing replica the one secret their cookies are signed with
COOKIE_SECRET_ENV = "GPUTAP_BILLING_COOKIE_SECRET"
MIN_COOKIE_SECRET = 32


class BadCookieSecret(Exception):
    """The cookie secret given in the environment is too short to sign logins with."""


def cookie_secret(path: Path, environ: Mapping[str, str] = os.environ) -> bytes:
    """The secret signing the page's login cookie. Given in the environment (the Helm chart's
    Secret), every replica signs alike, so a browser stays logged in whichever one answers;
    otherwise kept in ``path``, so restarts keep browsers logged in."""
    given = environ.get(COOKIE_SECRET_ENV)
    if given is not None:
        if len(given) < MIN_COOKIE_SECRET:
            raise BadCookieSecret(
                f"{COOKIE_SECRET_ENV} holds {len(given)} characters: it must hold at least "
                f"{MIN_COOKIE_SECRET} (random ones, e.g. `openssl rand -hex 32`), or be unset "
                "to keep a secret in billing's data directory"
            )
        return given.encode()
    try:
        return bytes.fromhex(path.read_text().strip())
    except (FileNotFoundError, ValueError):
        path.parent.mkdir(parents=True, exist_ok=True)
        secret = secrets.token_bytes(32)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secret.hex())
        return secret


def make_app(
    config: BillingConfig,
    store: Store,
    executor: ThreadPoolExecutor,
    prefix: str,
    secret: bytes | None = None,
    meter_listed: asyncio.Event | None = None,
) -> web.Application:
    """The tornado application serving everything under ``prefix``. ``meter_listed`` is set
    once the pod meter has listed the cluster (None: there is no pod meter)."""
    if meter_listed is None:
        meter_listed = asyncio.Event()
        meter_listed.set()
    # the singleton, so the OAuth callback handler shares it with the API handlers
    hub_auth = HubOAuth.instance(
        api_token=os.environ["JUPYTERHUB_API_TOKEN"],
        cache_max_age=60,
        cookie_options=dict(COOKIE_OPTIONS),
    )
    kwargs = {"store": store, "executor": executor, "config": config}
    return web.Application(
        make_handlers(prefix, kwargs),
        cookie_secret=secret or secrets.token_bytes(32),
        template_path=str(TEMPLATES),
        service_prefix=prefix,  # the pages' links to each other (handlers/pages.py)
        login_url=hub_auth.login_url,
        log_function=log_request,
        xsrf_cookie_kwargs=dict(COOKIE_OPTIONS),
        meter_listed=meter_listed,  # what the hub's stops wait for (handlers/sessions.py)
    )


async def main() -> None:
    """Run the service as JupyterHub starts it (``python -m billing_service``)."""
    logging.basicConfig(
        level=logging.INFO, format="[%(levelname)1.1s %(asctime)s %(name)s] %(message)s"
    )
    config = load_billing_config()
    prefix = os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "/services/billing/")
    if not prefix.endswith("/"):
        prefix += "/"
    url = urlparse(os.environ.get("JUPYTERHUB_SERVICE_URL", "http://127.0.0.1:8091"))
    # one database thread: writes are serialised and never block the event loop (see
    # docs/billing.md, "Storage", for why PostgreSQL keeps one too)
    executor = ThreadPoolExecutor(1, thread_name_prefix="billing-db")
    # an empty database gets the schema; one at another revision refuses to start (SchemaMismatch)
    engine = await asyncio.get_running_loop().run_in_executor(
        executor, open_database, config.database_url
    )
    store = Store(
        engine,
        config.price_book,
        trial_credit_micro=config.trial_credit_micro,
        min_billable_seconds=config.min_billable_seconds,
        hold_seconds=config.hold_seconds,
    )
    loop = asyncio.get_running_loop()
    book = await loop.run_in_executor(executor, store.sync_price_book, clock.utcnow())
    log.info("Price book version %s (%s) is in force", book.version, book.source)
    settings = load_billing_settings()
    secret = cookie_secret(settings.data_dir / "billing_cookie_secret")
    meter_listed = asyncio.Event()
    app = make_app(config, store, executor, prefix, secret, meter_listed)
    # bodies past MAX_STREAM_BYTES are not even read (the handlers refuse more than
    # MAX_BODY_BYTES with a 413 that says so)
    app.listen(
        url.port or 80, url.hostname or "127.0.0.1", xheaders=True, max_body_size=MAX_STREAM_BYTES
    )
    log.info("Billing listening on %s%s", url.geturl().rstrip("/"), prefix)
    # then, on Kubernetes, the pod meter (KubeConfigMissing ends billing if the API is
    # unusable): importing the Kubernetes client takes seconds, and JupyterHub 5 gives a
    # managed billing about 10 s to answer. Until the meter has listed the pods, the stops
    # the hub reports wait (docs/billing.md, "The pod meter has the first word")
    meter = await make_meter(config, settings.spawner, store, executor, meter_listed)
    if meter is None:
        meter_listed.set()

    async def load_accounts(now: datetime):
        return await loop.run_in_executor(executor, store.accounts_with_running_sessions, now)

    async def close_session(session_id: str, ended_at: datetime):
        await meter_listed.wait()  # a vanished pod's end is the meter's to date
        return await loop.run_in_executor(
            executor, store.stop_session, session_id, ended_at, clock.utcnow()
        )

    async def mark_seen(session_ids: list[str], at: datetime) -> None:
        await loop.run_in_executor(executor, store.mark_seen, session_ids, at)

    def post_charges() -> tuple[int, int]:
        return charge_pass(
            store,
            clock.utcnow(),
            config.charge_interval_seconds,
            config.charge_batch_size,
            config.charge_workers,
        )

    async def charge():
        return await loop.run_in_executor(executor, post_charges)

    hub = {
        "api_url": os.environ["JUPYTERHUB_API_URL"],
        "api_token": os.environ["JUPYTERHUB_API_TOKEN"],
    }
    enforcer = Enforcer(
        load_accounts,
        interval_seconds=config.enforce_interval_seconds,
        repeat_after=timedelta(seconds=config.max_overrun_seconds),
        **hub,
    )
    charger = Charger(charge, interval_seconds=config.charge_interval_seconds)
    reconciler = Reconciler(
        load_accounts,
        close_session,
        interval_seconds=config.reconcile_interval_seconds,
        mark_seen=mark_seen,
        **hub,
    )
    loops = [enforcer.run(), reconciler.run(), charger.run()]
    if meter is not None:
        loops.append(meter.run())
    await asyncio.gather(*loops)


async def make_meter(
    config: BillingConfig,
    spawner: dict,
    store: Store,
    executor: ThreadPoolExecutor,
    listed: asyncio.Event | None = None,
) -> KubeMeter | None:
    """The pod meter when servers run on Kubernetes (``spawner.backend: kubernetes``), where
    every session is a pod; None on the local backend, whose sessions only the spawner reports.
    ``listed`` is set when the meter has first listed the pods.

    ``KubeConfigMissing`` when the Kubernetes API cannot be configured.
    """
    spawner = validated("spawner", spawner)
    if spawner["backend"] != "kubernetes":
        return None
    # imported only here: the Kubernetes client takes seconds to import on a busy machine,
    # and JupyterHub 5 gives a managed billing about 10 s to answer before the hub gives up
    from .loops.kube_meter import KubeMeter, kube_configuration

    kube = spawner["kubernetes"]
    configuration = await kube_configuration(config.kubeconfig, kube["api_host"])
    namespace = kube["namespace"]
    log.info("Billing meters the gputap pods in namespace %s at %s", namespace, configuration.host)
    return KubeMeter.from_config(
        store,
        executor,
        configuration,
        namespace,
        seen_interval_seconds=config.meter_seen_interval_seconds,
        start_grace_seconds=config.meter_start_grace_seconds,
        listed=listed or asyncio.Event(),
    )
