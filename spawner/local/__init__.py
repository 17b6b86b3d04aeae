"""The one-machine backend: servers as local processes on this machine's GPUs (NVML, or a
declared inventory of simulated cards), data disks as folders. JupyterHub entry point
``gputap-local``."""
