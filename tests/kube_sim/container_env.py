"""A container's environment and command as the kubelet builds them: ``envFrom`` (secrets and
config maps, with ``prefix``), then ``env`` (``value`` with ``$(VAR)`` expansion,
``secretKeyRef``, ``configMapKeyRef``, ``fieldRef``), over what the kubelet sets itself; then
``command`` and ``args`` expanded in that environment. A container without a command runs an
idle process, the simulated image's own. A missing secret, config map or key is a ConfigError:
the kubelet's CreateContainerConfigError.
"""

from __future__ import annotations

import base64
import re
import sys

from .api import CONFIGMAP, SECRET, Api
from .store import Obj

_VAR_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")
# a container with no command runs this: the simulated "image" just stays up
IDLE_COMMAND = [sys.executable, "-c", "import signal; signal.pause()"]


class ConfigError(Exception):
    """The container cannot be configured (a missing secret or config map key)."""


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes $(VAR) expansion: defined names are replaced, $$ is a literal $."""

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))

    return _VAR_REF.sub(sub, text)


def _field_ref(pod: Obj, path: str) -> str:
    meta = pod["metadata"]
    status = pod.get("status") or {}
    simple = {
        "metadata.name": meta["name"],
        "metadata.namespace": meta["namespace"],
        "metadata.uid": meta.get("uid", ""),
        "spec.nodeName": pod["spec"].get("nodeName", ""),
        "spec.serviceAccountName": pod["spec"].get("serviceAccountName", "default"),
        "status.podIP": status.get("podIP", ""),
        "status.hostIP": status.get("hostIP", ""),
    }
    if path in simple:
        return simple[path]
    m = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
    if m:
        return (meta.get(m.group(1)) or {}).get(m.group(2), "")
    raise ConfigError(f"unsupported fieldRef {path}")


def container_env(api: Api, pod: Obj, container: Obj, env: dict[str, str]) -> dict[str, str]:
    """``env`` (what the kubelet sets: PATH, HOME, KUBERNETES_SERVICE_*) with the container's
    ``envFrom`` and then its ``env`` over it."""
    env = dict(env)
    ns = pod["metadata"]["namespace"]
    for source in container.get("envFrom") or []:
        prefix = source.get("prefix", "")
        for kind, rt in (("secretRef", SECRET), ("configMapRef", CONFIGMAP)):
            ref = source.get(kind)
            if not ref:
                continue
            obj = api.find(rt, ns, ref["name"])
            if obj is None:
                if ref.get("optional"):
                    continue
                raise ConfigError(f'{rt.kind.lower()} "{ref["name"]}" not found')
            for k, v in (obj.get("data") or {}).items():
                env[prefix + k] = base64.b64decode(v).decode() if rt is SECRET else v
    for item in container.get("env") or []:
        env[item["name"]] = _env_value(api, pod, item, env)
    return env


def _env_value(api: Api, pod: Obj, item: Obj, env: dict[str, str]) -> str:
    if "valueFrom" not in item:
        return expand(str(item.get("value", "")), env)
    source = item["valueFrom"]
    ns = pod["metadata"]["namespace"]
    if "fieldRef" in source:
        return _field_ref(pod, source["fieldRef"]["fieldPath"])
    for kind, rt in (("secretKeyRef", SECRET), ("configMapKeyRef", CONFIGMAP)):
        ref = source.get(kind)
        if not ref:
            continue
        obj = api.find(rt, ns, ref["name"])
        data = (obj or {}).get("data") or {}
        if ref["key"] not in data:
            if ref.get("optional"):
                return ""
            if obj is None:
                raise ConfigError(f'{rt.kind.lower()} "{ref["name"]}" not found')
            raise ConfigError(f"couldn't find key {ref['key']} in {rt.kind} {ns}/{ref['name']}")
        value = data[ref["key"]]
        return base64.b64decode(value).decode() if rt is SECRET else value
    raise ConfigError(f"unsupported valueFrom for {item['name']}")


def container_argv(container: Obj, env: dict[str, str]) -> list[str]:
    """The process the container runs: its command and args, each $(VAR)-expanded in
    ``env``; args alone when it has no command; else the idle process."""
    command = [expand(a, env) for a in container.get("command") or []]
    args = [expand(a, env) for a in container.get("args") or []]
    return (command + args) if command else (IDLE_COMMAND if not args else args)
