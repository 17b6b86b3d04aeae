"""JupyterHub configuration of gputap: everything comes from the settings (see README)."""

from gputap_common.settings import load_settings
from hub_config.hub import apply

c = get_config()  # noqa: F821 (provided by JupyterHub)
apply(c, load_settings())
