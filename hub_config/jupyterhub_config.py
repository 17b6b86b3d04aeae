"""JupyterHub configuration of gputap: everything comes from the settings (see README)."""

from hub_config.hub import apply
from hub_config.settings import load_settings

c = get_config()  # noqa: F821 (provided by JupyterHub)
apply(c, load_settings())
