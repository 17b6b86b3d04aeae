"""Shared data, read-only (settings ``shared_data``; docs/lab.md, "Shared data, read-only")
into the spawner's configuration: on Kubernetes volumes and mounts of every server's pod, on
one machine the folders the spawner links into homes, checked here as the hub starts."""

from __future__ import annotations

import logging
from typing import Any

from gputap_common.settings import Settings, SettingsError
from spawner.kube.shared_data import shared_data_pod_settings
from spawner.local.shared_data import folder_problem, writable_by_hub

from .server_users import servers_run_as

log = logging.getLogger("gputap.config")


def configure_shared_data(c: Any, settings: Settings, kube_home: str) -> None:
    """Mount ``settings.shared_data`` read-only in every server; on Kubernetes the servers'
    home is mounted at ``kube_home``. A one-machine folder that is missing, or that servers
    running as system users could write, stops the hub (SettingsError)."""
    entries = settings.shared_data
    if not entries:
        return
    if settings.spawner["backend"] == "kubernetes":
        pod = shared_data_pod_settings(entries, kube_home)
        c.KubeSpawner.volumes = [*c.KubeSpawner.get("volumes", []), *pod["volumes"]]
        c.KubeSpawner.volume_mounts = [
            *c.KubeSpawner.get("volume_mounts", []),
            *pod["volume_mounts"],
        ]
        c.KubeSpawner.environment = {**c.KubeSpawner.get("environment", {}), **pod["environment"]}
        return
    other_users = servers_run_as(settings.spawner) != "hub"
    for i, entry in enumerate(entries):
        problem = folder_problem(entry, f"shared_data[{i}]", other_users)
        if problem:
            raise SettingsError(problem)
        if not other_users and writable_by_hub(entry):
            log.warning(
                "shared_data[%d] %s: servers run as the hub's own user, who may write %s; "
                "it is read-only only by agreement (a hub running as root with "
                "spawner.server_user auto or per_user makes it so)",
                i,
                entry["name"],
                entry["folder"],
            )
    c.GPULocalSpawner.shared_data = entries
