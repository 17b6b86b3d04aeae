"""Kubernetes' Pod Security Standards, the ``restricted`` profile, as the API server's Pod
Security admission checks a pod (kubernetes/pod-security-admission, policy version 1.30+):
what a namespace labelled ``pod-security.kubernetes.io/enforce: restricted`` refuses.

Each check returns the sentences admission would put in its "violates PodSecurity" answer;
an empty list is a pod it admits. As strict as admission wherever gputap's pods go: every
container (init and ephemeral ones too), pod-level settings counted where admission counts
them.
"""

from __future__ import annotations

from typing import Any

#: volume types ``restricted`` allows (everything else: hostPath, nfs, ... is refused)
ALLOWED_VOLUMES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}
#: baseline's capabilities; restricted allows adding NET_BIND_SERVICE only
RESTRICTED_ADD = {"NET_BIND_SERVICE"}
SAFE_SYSCTLS = {
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
}


def _containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        *spec.get("initContainers", []),
        *spec.get("containers", []),
        *spec.get("ephemeralContainers", []),
    ]


def restricted_violations(spec: dict[str, Any]) -> list[str]:
    """What Pod Security ``restricted`` refuses in a pod ``spec``."""
    found: list[str] = []
    pod_sc = spec.get("securityContext") or {}
    containers = _containers(spec)
    # -- baseline ----------------------------------------------------------------------
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(key):
            found.append(f"host namespaces ({key}=true)")
    for c in containers:
        sc = c.get("securityContext") or {}
        name = c.get("name", "?")
        if sc.get("privileged"):
            found.append(f'privileged (container "{name}" must not set privileged=true)')
        if any(p.get("hostPort") for p in c.get("ports", [])):
            found.append(f'hostPort (container "{name}" uses hostPort)')
        if sc.get("procMount", "Default") != "Default":
            found.append(f'procMount (container "{name}" must not set procMount)')
    if pod_sc.get("sysctls") and any(s["name"] not in SAFE_SYSCTLS for s in pod_sc["sysctls"]):
        found.append("forbidden sysctls")
    # -- restricted: volumes -------------------------------------------------------------
    for volume in spec.get("volumes", []):
        kinds = set(volume) - {"name"}
        if not kinds <= ALLOWED_VOLUMES:
            found.append(
                f'restricted volume types (volume "{volume.get("name")}" uses '
                f"{', '.join(sorted(kinds - ALLOWED_VOLUMES))})"
            )
    # -- restricted: every container ---------------------------------------------------
    pod_non_root = pod_sc.get("runAsNonRoot")
    pod_seccomp = (pod_sc.get("seccompProfile") or {}).get("type")
    if pod_sc.get("runAsUser") == 0:
        found.append("runAsUser=0 (pod must not set runAsUser=0)")
    if pod_seccomp is not None and pod_seccomp not in ("RuntimeDefault", "Localhost"):
        found.append(f"seccompProfile (pod must not set type={pod_seccomp})")
    for c in containers:
        sc = c.get("securityContext") or {}
        name = c.get("name", "?")
        if sc.get("allowPrivilegeEscalation") is not False:
            found.append(f'allowPrivilegeEscalation != false (container "{name}")')
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            found.append(f'unrestricted capabilities (container "{name}" must drop ALL)')
        added = set(caps.get("add") or []) - RESTRICTED_ADD
        if added:
            found.append(f'unrestricted capabilities (container "{name}" adds {sorted(added)})')
        non_root = sc.get("runAsNonRoot", pod_non_root)
        if non_root is not True:
            found.append(f'runAsNonRoot != true (container "{name}")')
        if sc.get("runAsUser") == 0:
            found.append(f'runAsUser=0 (container "{name}")')
        seccomp = (sc.get("seccompProfile") or {}).get("type", pod_seccomp)
        if seccomp not in ("RuntimeDefault", "Localhost"):
            found.append(
                f'seccompProfile (container "{name}" must set RuntimeDefault or Localhost)'
            )
    return found


def pod_specs(manifests: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """``kind/name`` -> the pod spec of every object in ``manifests`` that makes pods."""
    specs = {}
    for obj in manifests:
        kind = obj.get("kind")
        if kind == "Pod":
            spec = obj["spec"]
        elif kind in ("Deployment", "DaemonSet", "StatefulSet", "ReplicaSet", "Job"):
            spec = obj["spec"]["template"]["spec"]
        elif kind == "CronJob":
            spec = obj["spec"]["jobTemplate"]["spec"]["template"]["spec"]
        else:
            continue
        specs[f"{kind}/{obj['metadata']['name']}"] = spec
    return specs
