"""gputap billing: a JupyterHub service that meters GPU sessions per second in credits."""
