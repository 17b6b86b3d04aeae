"""A simulated Kubernetes cluster for tests and benchmarks: see README.md."""

from .cluster import SimulatedCluster, admin_key
from .cluster_thread import ClusterThread
from .node_shapes import gpu_node_spec

__all__ = ["ClusterThread", "SimulatedCluster", "admin_key", "gpu_node_spec"]
