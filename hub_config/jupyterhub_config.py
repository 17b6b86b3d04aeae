"""JupyterHub configuration of gputap: everything comes from the settings (see README)."""

import os

from gputap_common.settings import load_settings
from hub_config.hub import apply

# what the hub and the processes it starts (billing, the proxy, the culler, servers) write
# is their user's alone: databases, secrets, logs (docs/security.md)
os.umask(0o077)

c = get_config()  # noqa: F821 (provided by JupyterHub)
apply(c, load_settings())
