"""Who one-machine servers run as, from the settings (spawner/local/accounts.py has the rules;
docs/security.md, "Servers' Unix users")."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from gputap_common.settings import SettingsError
from spawner.local.accounts import AccountError, server_user_mode


def servers_run_as(spawner: Mapping[str, Any]) -> str:
    """What the settings' one-machine servers run as ("system", "per_user", "hub"; "hub" on
    Kubernetes, where pods are what they are); a choice this hub cannot carry out is a
    SettingsError, saying why."""
    if spawner["backend"] != "local":
        return "hub"
    try:
        return server_user_mode(spawner["server_user"], spawner["run_as_system_user"], os.geteuid())
    except AccountError as e:
        raise SettingsError(str(e)) from None
