"""A simulated Kubernetes cluster for tests and benchmarks: see README.md."""

from .cluster import ClusterThread, SimulatedCluster, admin_key, gpu_node_spec

__all__ = ["ClusterThread", "SimulatedCluster", "admin_key", "gpu_node_spec"]
