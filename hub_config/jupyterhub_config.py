"""JupyterHub configuration of gputap: everything comes from the settings (see README)."""

import os

from gputap_common.settings import exit_on_refusal, load_settings
from hub_config.hub import apply

# what the hub and the processes it starts (billing, the proxy, the culler, servers) write
# is their user's alone: databases, secrets, logs (docs/security.md)
os.umask(0o077)

c = get_config()  # noqa: F821 (provided by JupyterHub)
# a settings typo is one line and a failed start: JupyterHub would print it inside the
# traceback of this file
with exit_on_refusal("hub"):
    apply(c, load_settings())
