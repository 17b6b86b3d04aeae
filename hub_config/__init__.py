"""gputap's JupyterHub configuration and its one settings source."""
