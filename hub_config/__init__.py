"""gputap's JupyterHub configuration, made from the settings (``gputap_common.settings``)."""
