"""The Kubernetes backend: servers as pods on the cluster's GPU nodes (a watch-based inventory
of nodes and pods), data disks as PersistentVolumeClaims. JupyterHub entry point
``gputap-kubernetes``."""
