"""The API server's HTTPS endpoint, for clients that only speak in-cluster configuration.

A pod's client (``load_incluster_config`` in kubernetes and kubernetes_asyncio, which KubeSpawner
and billing use when no kubeconfig is set) builds ``https://$KUBERNETES_SERVICE_HOST:PORT`` and
checks the server against the cluster CA in the pod's service account volume
(``/var/run/secrets/kubernetes.io/serviceaccount/ca.crt``). A real API server's certificate is
signed by that CA for the ``kubernetes`` Service's names and IP (kubeadm: "kubernetes",
"kubernetes.default", "kubernetes.default.svc", the cluster IP), so this one is too, for
the addresses where the simulated server listens (127.0.0.1, and the pod network's gateway
where pods reach it). Certificates come from certipy, the library
JupyterHub makes its own internal CA with.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

from certipy import Certipy

#: the ``kubernetes`` Service's DNS names a real API server's certificate carries
SERVICE_NAMES = [
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
]


@dataclass(frozen=True)
class ServingCertificate:
    """The cluster CA (what a pod mounts as ``ca.crt``) and the server's key pair."""

    ca_cert: Path
    cert: Path
    key: Path

    def server_context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.cert, self.key)
        return context


def serving_certificate(
    directory: Path, ips: tuple[str, ...] = ("127.0.0.1",)
) -> ServingCertificate:
    """A new cluster CA in ``directory`` and the API server's certificate it signed for
    ``ips`` and the ``kubernetes`` Service's names."""
    certs = Certipy(store_dir=str(directory))
    ca = certs.create_ca("kube-ca")
    alt_names = [*(f"IP:{ip}" for ip in ips), *(f"DNS:{name}" for name in SERVICE_NAMES)]
    server = certs.create_signed_pair("kube-apiserver", "kube-ca", alt_names=alt_names)
    return ServingCertificate(
        ca_cert=Path(ca["files"]["cert"]),
        cert=Path(server["files"]["cert"]),
        key=Path(server["files"]["key"]),
    )
