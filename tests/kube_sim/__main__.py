"""Run a simulated cluster standalone: python -m tests.kube_sim --nodes spec.yaml --port 8001

The node spec is YAML (or JSON):

    nodes:
      - name: a100-1
        gpu: {product: NVIDIA-A100-SXM4-80GB, gpus: 8}
      - name: mig-1
        gpu: {product: NVIDIA-A100-SXM4-80GB, gpus: 8, mig: all-1g.10gb}
      - name: cpu-1
        allocatable: {cpu: "32", memory: 128Gi}
        labels: {pool: cpu}
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal

import yaml

from .cluster import SimulatedCluster


def add_nodes(cluster: SimulatedCluster, spec: dict | list) -> None:
    """Add the nodes a spec declares (a list, or a mapping with a `nodes` list)."""
    nodes = spec.get("nodes", []) if isinstance(spec, dict) else spec
    for node in nodes:
        node = dict(node)
        name = node.pop("name")
        gpu = node.pop("gpu", None)
        if gpu is not None:
            cluster.gpu_node(name, **gpu)
        else:
            cluster.add_node(name, **node)


async def serve(args: argparse.Namespace, spec: dict | list) -> None:
    cluster = SimulatedCluster(
        port=args.port, seed=args.seed, image_pull_delay=args.image_pull_delay
    )
    await cluster.start()
    add_nodes(cluster, spec)
    if args.kubeconfig:
        cluster.write_kubeconfig(args.kubeconfig)
    # a hub for these pods listens at the pods' gateway (spawner.kubernetes.hub_ip)
    print(
        f"simulated cluster at {cluster.url}; pods reach this host at {cluster.host_ip}", flush=True
    )
    if not args.kubeconfig:
        # every request needs a token; the administrator's is only written, never printed
        print("no --kubeconfig: requests will be refused (401) without its token", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await cluster.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m tests.kube_sim",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--nodes", help="YAML file declaring the nodes")
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (0: any free)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the fault RNG")
    parser.add_argument(
        "--image-pull-delay",
        type=float,
        default=0.0,
        help="seconds each pod spends pulling its image",
    )
    parser.add_argument(
        "--kubeconfig",
        help="write a kubeconfig for the cluster here, with the administrator's bearer token",
    )
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(name)s %(message)s")
    spec: dict | list = []
    if args.nodes:
        with open(args.nodes) as f:
            spec = yaml.safe_load(f) or []
    asyncio.run(serve(args, spec))


if __name__ == "__main__":
    main()
