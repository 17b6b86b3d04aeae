"""The simulated API server's HTTP edge: Kubernetes REST paths and JSON shapes over tornado."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import tornado.web
from tornado.iostream import StreamClosedError

from . import owners
from .api import BY_PATH, NODE, POD, RESOURCE_TYPES, Api, ResourceType
from .faults import Faults
from .patch import json_patch, merge_patch
from .rbac import Rbac
from .store import (
    ApiError,
    Obj,
    WatchEvent,
    fields_match,
    labels_match,
    parse_field_selector,
    parse_label_selector,
)

log = logging.getLogger("kube_sim.server")

# (namespace, pod, container, tail_lines) -> log text, or None when the container never started
LogSource = Callable[[str, str, str | None, int | None], str | None]

DEFAULT_WATCH_SECONDS = 1800
SERVER_VERSION = {
    "major": "1",
    "minor": "31",
    "gitVersion": "v1.31.0-gputap-sim",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2024-08-13T00:00:00Z",
    "goVersion": "go1.22.5",
    "compiler": "gc",
    "platform": "linux/amd64",
}


def _success(code: int = 200, **details: Any) -> Obj:
    body: Obj = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"}
    if details:
        body["details"] = details
    body["code"] = code
    return body


class BaseHandler(tornado.web.RequestHandler):
    def initialize(self, api: Api, faults: Faults, logs: LogSource, rbac: Rbac) -> None:
        self.api = api
        self.faults = faults
        self.logs = logs
        self.rbac = rbac

    def check_xsrf_cookie(self) -> None:  # the API server has no cookies
        pass

    #: what a silent request waits on: None once the client or the server closes
    _silence: asyncio.Queue | None = None
    _client_gone = False

    async def prepare(self) -> None:
        # authentication and authorization come first, before the path is even known to exist
        query = {k: v[0].decode() for k, v in self.request.query_arguments.items() if v}
        refusal = self.rbac.check(
            self.request.method or "GET",
            self.request.path,
            query,
            self.request.headers.get("Authorization"),
        )
        if refusal is not None:
            code, body = refusal
            self.send_json(body, code)
            return
        is_watch = self.get_query_argument("watch", "").lower() in ("1", "true")
        user = self.rbac.user_of(self.request.headers.get("Authorization"))
        if self.faults.silence_requests and not is_watch and self.faults.silences(user):
            await self.stay_silent(asyncio.Queue())
            raise tornado.web.Finish()
        code = self.faults.decide(self.request.method or "GET", self.request.path, is_watch, user)
        if code is not None:
            log.info("injected %d for %s %s", code, self.request.method, self.request.path)
            self.send_json(self.faults.status_body(code), code)

    async def stay_silent(self, queue: asyncio.Queue) -> None:
        """Send nothing and close nothing, as a connection through a NAT or load balancer
        that forgot it: until the client gives up (or the server shuts down). ``queue``
        receives what happens meanwhile (a watch's events, dropped) and None at the end."""
        log.info("%s %s goes silent", self.request.method, self.request.path)
        self._silence = queue
        watchers: set = self.application.settings["kube_watchers"]
        watchers.add(queue)
        try:
            while not self._client_gone and await queue.get() is not None:
                pass
        finally:
            watchers.discard(queue)
        self.request.connection.close()

    def on_connection_close(self) -> None:
        # a silent request never writes, so only this tells it that the client gave up
        self._client_gone = True
        if self._silence is not None:
            self._silence.put_nowait(None)

    def send_json(self, body: Any, code: int = 200) -> None:
        self.set_status(code)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(body))

    def send_error_status(self, err: ApiError) -> None:
        self.send_json(err.status(), err.code)

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info", (None, None))[1]
        if isinstance(exc, ApiError):
            self.send_error_status(exc)
            return
        message = self._reason if status_code != 500 else f"internal error: {exc!r}"
        reason = {404: "NotFound", 405: "MethodNotAllowed", 400: "BadRequest"}.get(
            status_code, "InternalError"
        )
        self.send_json(ApiError(status_code, reason, message).status(), status_code)

    def requester(self) -> Any:
        """Who makes this request (prepare() refused it if nobody), for admission."""
        return self.rbac.identity_of(self.request.headers.get("Authorization"))

    def json_body(self) -> Any:
        try:
            return json.loads(self.request.body or b"null")
        except ValueError as e:
            raise ApiError(400, "BadRequest", f"the body of the request was invalid: {e}") from e


class DiscoveryHandler(BaseHandler):
    def get(self, which: str) -> None:
        host = self.request.host
        if which == "version":
            self.send_json(SERVER_VERSION)
        elif which == "api":
            self.send_json(
                {
                    "kind": "APIVersions",
                    "versions": ["v1"],
                    "serverAddressByClientCIDRs": [
                        {"clientCIDR": "0.0.0.0/0", "serverAddress": host}
                    ],
                }
            )
        elif which == "apis":
            groups = sorted({(r.group, r.version) for r in RESOURCE_TYPES if r.group})
            self.send_json(
                {
                    "kind": "APIGroupList",
                    "apiVersion": "v1",
                    "groups": [
                        {
                            "name": g,
                            "versions": [{"groupVersion": f"{g}/{v}", "version": v}],
                            "preferredVersion": {"groupVersion": f"{g}/{v}", "version": v},
                        }
                        for g, v in groups
                    ],
                }
            )


class GroupVersionHandler(BaseHandler):
    def get(self, group: str, version: str) -> None:
        """The APIResourceList of one group version."""
        gv = f"{group}/{version}" if group else version
        resources = [r for r in RESOURCE_TYPES if r.api_version == gv]
        if not resources:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        verbs = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
        self.send_json(
            {
                "kind": "APIResourceList",
                "apiVersion": "v1",
                "groupVersion": gv,
                "resources": [
                    {
                        "name": r.plural,
                        "singularName": r.kind.lower(),
                        "namespaced": r.namespaced,
                        "kind": r.kind,
                        "verbs": verbs,
                    }
                    for r in resources
                ],
            }
        )


class ResourceHandler(BaseHandler):
    """Every /api/v1/... and /apis/{group}/{version}/... resource path."""

    def parse(self, prefix: str, rest: str) -> tuple[ResourceType, str | None, str, str]:
        """(resource type, namespace or None, name, subresource) from the URL."""
        parts = [p for p in rest.split("/") if p]
        if prefix == "api":
            if not parts or parts[0] != "v1":
                raise self._unknown()
            gv, parts = "v1", parts[1:]
        else:
            if len(parts) < 2:
                raise self._unknown()
            gv, parts = f"{parts[0]}/{parts[1]}", parts[2:]
        namespace: str | None = None
        if len(parts) >= 3 and parts[0] == "namespaces":
            namespace, parts = parts[1], parts[2:]
        if not parts or len(parts) > 3:
            raise self._unknown()
        rt = BY_PATH.get((gv, parts[0]))
        if rt is None or (namespace is not None and not rt.namespaced):
            raise self._unknown()
        name = parts[1] if len(parts) > 1 else ""
        sub = parts[2] if len(parts) > 2 else ""
        if sub and (rt, sub) not in {
            (POD, "status"),
            (POD, "binding"),
            (POD, "log"),
            (NODE, "status"),
        }:
            raise self._unknown()
        if rt.namespaced and name and namespace is None:
            raise self._unknown()  # a namespaced object needs its namespace in the path
        return rt, namespace, name, sub

    @staticmethod
    def _unknown() -> ApiError:
        return ApiError(404, "NotFound", "the server could not find the requested resource")

    async def _run(self, verb: str, prefix: str, rest: str) -> None:
        try:
            rt, ns, name, sub = self.parse(prefix, rest)
            await getattr(self, "do_" + verb)(rt, ns or "", name, sub)
        except ApiError as e:
            if not self._finished:
                self.send_error_status(e)

    async def get(self, prefix: str, rest: str) -> None:
        await self._run("get", prefix, rest)

    async def post(self, prefix: str, rest: str) -> None:
        await self._run("post", prefix, rest)

    async def put(self, prefix: str, rest: str) -> None:
        await self._run("put", prefix, rest)

    async def patch(self, prefix: str, rest: str) -> None:
        await self._run("patch", prefix, rest)

    async def delete(self, prefix: str, rest: str) -> None:
        await self._run("delete", prefix, rest)

    # -- verbs ---------------------------------------------------------------------------------

    async def do_get(self, rt: ResourceType, ns: str, name: str, sub: str) -> None:
        if sub == "log":
            self.send_log(ns, name)
        elif name:
            self.send_json(self.api.get(rt, ns, name))
        elif self.get_query_argument("watch", "").lower() in ("1", "true"):
            await self.watch(rt, ns)
        else:
            items = self.api.list(
                rt,
                ns or None,
                self.get_query_argument("labelSelector", None),
                self.get_query_argument("fieldSelector", None),
            )
            self.send_json(
                {
                    "kind": rt.list_kind,
                    "apiVersion": rt.api_version,
                    "metadata": {"resourceVersion": self.api.store.resource_version},
                    "items": items,
                }
            )

    async def do_post(self, rt: ResourceType, ns: str, name: str, sub: str) -> None:
        body = self.json_body()
        if not isinstance(body, dict):
            raise ApiError(400, "BadRequest", "the body of the request must be a JSON object")
        if sub == "binding":
            target = (body.get("target") or {}).get("name")
            if not target:
                raise ApiError(
                    422, "Invalid", f'Binding "{name}" is invalid: target.name: Required value'
                )
            self.api.bind(ns, name, target)
            self.send_json(_success(201), 201)
        elif name:
            raise ApiError(
                405,
                "MethodNotAllowed",
                "the server does not allow this method on the requested resource",
            )
        else:
            if rt.namespaced and not ns:
                raise self._unknown()
            self.send_json(self.api.create(rt, ns, body, self.requester()), 201)

    async def do_put(self, rt: ResourceType, ns: str, name: str, sub: str) -> None:
        if not name or sub not in ("", "status"):
            raise ApiError(
                405,
                "MethodNotAllowed",
                "the server does not allow this method on the requested resource",
            )
        body = self.json_body()
        if not isinstance(body, dict):
            raise ApiError(400, "BadRequest", "the body of the request must be a JSON object")
        self.send_json(self.api.replace(rt, ns, name, body, sub, self.requester()))

    async def do_patch(self, rt: ResourceType, ns: str, name: str, sub: str) -> None:
        if not name or sub not in ("", "status"):
            raise ApiError(
                405,
                "MethodNotAllowed",
                "the server does not allow this method on the requested resource",
            )
        content_type = (self.request.headers.get("Content-Type") or "").split(";")[0].strip()
        current = self.api.get(rt, ns, name)
        body = self.json_body()
        if content_type == "application/json-patch+json":
            if not isinstance(body, list):
                raise ApiError(400, "BadRequest", "a JSON patch must be a list of operations")
            try:
                patched = json_patch(current, body)
            except ValueError as e:
                raise ApiError(422, "Invalid", f"the JSON patch could not be applied: {e}") from e
        elif content_type in (
            "application/merge-patch+json",
            "application/strategic-merge-patch+json",
        ):
            if not isinstance(body, dict):
                raise ApiError(400, "BadRequest", "a merge patch must be a JSON object")
            patched = merge_patch(current, body)
        else:
            raise ApiError(
                415,
                "UnsupportedMediaType",
                f"the body of the request was in an unknown format - accepted media types "
                f"include: application/json-patch+json, application/merge-patch+json, "
                f'application/strategic-merge-patch+json (got "{content_type}")',
            )
        self.send_json(self.api.replace(rt, ns, name, patched, sub, self.requester()))

    async def do_delete(self, rt: ResourceType, ns: str, name: str, sub: str) -> None:
        if sub:
            raise ApiError(
                405,
                "MethodNotAllowed",
                "the server does not allow this method on the requested resource",
            )
        grace = self._grace_seconds()
        propagation = self._propagation_policy()
        if name:
            self.send_json(self.api.delete(rt, ns, name, grace, propagation))
            return
        items = self.api.list(
            rt,
            ns or None,
            self.get_query_argument("labelSelector", None),
            self.get_query_argument("fieldSelector", None),
        )
        deleted = []
        for obj in items:
            meta = obj["metadata"]
            try:
                deleted.append(
                    self.api.delete(rt, meta.get("namespace", ""), meta["name"], grace, propagation)
                )
            except ApiError:
                pass
        self.send_json(
            {
                "kind": rt.list_kind,
                "apiVersion": rt.api_version,
                "metadata": {"resourceVersion": self.api.store.resource_version},
                "items": deleted,
            }
        )

    def _grace_seconds(self) -> int | None:
        arg = self._delete_option("gracePeriodSeconds")
        if arg is None:
            return None
        try:
            return max(0, int(arg))
        except ValueError as e:
            raise ApiError(400, "BadRequest", f"invalid gracePeriodSeconds {arg!r}") from e

    def _delete_option(self, key: str) -> Any:
        """A DeleteOptions field, from the query or else the request's body."""
        arg = self.get_query_argument(key, None)
        if arg is None and self.request.body:
            body = self.json_body()
            if isinstance(body, dict):
                arg = body.get(key)
        return arg

    def _propagation_policy(self) -> str:
        orphan = self._delete_option("orphanDependents")
        if isinstance(orphan, str):
            orphan = orphan.lower() in ("1", "t", "true")
        return owners.propagation_policy(self._delete_option("propagationPolicy"), orphan)

    def send_log(self, ns: str, name: str) -> None:
        pod = self.api.get(POD, ns, name)
        container = self.get_query_argument("container", None)
        tail = self.get_query_argument("tailLines", None)
        text = self.logs(ns, name, container, int(tail) if tail else None)
        if text is None:
            cname = container or pod["spec"]["containers"][0]["name"]
            raise ApiError(
                400,
                "BadRequest",
                f'container "{cname}" in pod "{name}" is waiting to start: ContainerCreating',
            )
        self.set_header("Content-Type", "text/plain")
        self.finish(text)

    # -- watch ---------------------------------------------------------------------------------

    async def watch(self, rt: ResourceType, ns: str) -> None:
        label_sel = self.get_query_argument("labelSelector", None)
        field_sel = self.get_query_argument("fieldSelector", None)
        try:
            parse_label_selector(label_sel)
            parse_field_selector(field_sel)
        except ValueError as e:
            raise ApiError(400, "BadRequest", str(e)) from e
        rv_arg = self.get_query_argument("resourceVersion", "") or ""
        timeout = float(self.get_query_argument("timeoutSeconds", "0") or 0)
        if not timeout:
            timeout = DEFAULT_WATCH_SECONDS
        if self.faults.watch_max_seconds is not None:
            timeout = min(timeout, self.faults.watch_max_seconds)
        max_events = self.faults.watch_max_events
        deadline = time.monotonic() + timeout
        user = self.rbac.user_of(self.request.headers.get("Authorization"))

        def wanted(event: WatchEvent) -> bool:
            av, kind, ens, _ = event.key
            if (av, kind) != (rt.api_version, rt.kind) or (ns and ens != ns):
                return False
            labels = event.obj["metadata"].get("labels") or {}
            return labels_match(label_sel, labels) and fields_match(field_sel, event.obj)

        queue: asyncio.Queue[WatchEvent | None] = asyncio.Queue()
        # subscribe and read the backlog with no await between: no event is lost or doubled
        unsubscribe = self.api.store.subscribe(queue.put_nowait)
        watchers: set = self.application.settings["kube_watchers"]
        watchers.add(queue)
        try:
            if rv_arg in ("", "0"):
                backlog = [
                    ("ADDED", obj) for obj in self.api.list(rt, ns or None, label_sel, field_sel)
                ]
            else:
                try:
                    since = int(rv_arg)
                except ValueError as e:
                    raise ApiError(400, "BadRequest", f"invalid resourceVersion {rv_arg!r}") from e
                try:
                    backlog = [
                        (e.type, e.obj) for e in self.api.store.events_since(since) if wanted(e)
                    ]
                except ApiError as e:
                    self.set_header("Content-Type", "application/json")
                    self.finish(json.dumps({"type": "ERROR", "object": e.status()}) + "\n")
                    return
            self.set_status(200)
            self.set_header("Content-Type", "application/json")
            self.set_header("Transfer-Encoding", "chunked")
            await self.flush()
            self._silence = queue  # a client closing the stream ends the wait for events
            pending, sent, opened = deque(backlog), 0, time.monotonic()
            while max_events is None or sent < max_events:
                if pending:
                    type_, obj = pending.popleft()
                else:
                    remaining = deadline - time.monotonic()
                    try:
                        event = await asyncio.wait_for(queue.get(), max(remaining, 0))
                    except TimeoutError:
                        event = None  # the watch's time is up
                    if event is None:  # ... or the server is shutting down, or the client left
                        if self.faults.watch_silent(sent, time.monotonic() - opened, user):
                            await self.stay_silent(queue)  # not even the end is sent
                            return
                        break
                    if not wanted(event):
                        continue
                    type_, obj = event.type, event.obj
                if self.faults.watch_silent(sent, time.monotonic() - opened, user):
                    await self.stay_silent(queue)
                    return
                await self._send_event(type_, obj)
                sent += 1
            self.finish()
        except StreamClosedError:
            pass
        finally:
            unsubscribe()
            watchers.discard(queue)

    async def _send_event(self, type_: str, obj: Obj) -> None:
        line = json.dumps({"type": type_, "object": obj}) + "\n"
        self.write(line)
        if self.faults.watch_duplicates:
            self.write(line)
            self.faults.count_duplicate()
        await self.flush()


class UnknownPathHandler(BaseHandler):
    """Any other path: authorized like every request (a user without the rule gets 403 for it,
    as from the real server), then 404."""

    def get(self, *args: Any) -> None:
        raise tornado.web.HTTPError(404)

    post = put = patch = delete = get


def end_watches(app: tornado.web.Application) -> None:
    """Finish every open watch stream, as the real server does when it shuts down."""
    for queue in list(app.settings["kube_watchers"]):
        queue.put_nowait(None)


def make_app(api: Api, faults: Faults, logs: LogSource, rbac: Rbac) -> tornado.web.Application:
    """The tornado application serving the Kubernetes API paths."""
    kwargs = {"api": api, "faults": faults, "logs": logs, "rbac": rbac}
    return tornado.web.Application(
        [
            (r"/(version)/?", DiscoveryHandler, kwargs),
            (r"/(api)/?", DiscoveryHandler, kwargs),
            (r"/(apis)/?", DiscoveryHandler, kwargs),
            (r"/api/()(v1)/?", GroupVersionHandler, kwargs),
            (r"/apis/([^/]+)/([^/]+)/?", GroupVersionHandler, kwargs),
            (r"/(api|apis)/(.+)", ResourceHandler, kwargs),
        ],
        default_handler_class=UnknownPathHandler,
        default_handler_args=kwargs,
        compress_response=False,
        kube_watchers=set(),
        log_function=_log_request,
    )


def _log_request(handler: tornado.web.RequestHandler) -> None:
    # request paths only, never query strings (they may carry selectors with user names)
    log.debug("%d %s %s", handler.get_status(), handler.request.method, handler.request.path)
