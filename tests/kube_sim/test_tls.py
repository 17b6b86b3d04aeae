"""The simulated API server over HTTPS, as an in-cluster client finds it: the service
environment, the service account's token and the cluster CA."""

import kubernetes
import pytest
import urllib3
from kubernetes.config.incluster_config import InClusterConfigLoader

from tests.kube_sim.cluster import SimulatedCluster
from tests.kube_sim.tls import serving_certificate


@pytest.fixture(scope="module")
def cluster():
    with SimulatedCluster.run_in_thread() as c:
        c.gpu_node("gpu-1")
        yield c


def in_cluster_client(
    ca_cert, port, tmp_path, token_text, host: str = "127.0.0.1"
) -> kubernetes.client.CoreV1Api:
    token = tmp_path / "token"
    token.write_text(token_text)
    configuration = kubernetes.client.Configuration()
    InClusterConfigLoader(
        token_filename=str(token),
        cert_filename=str(ca_cert),
        environ={"KUBERNETES_SERVICE_HOST": host, "KUBERNETES_SERVICE_PORT": str(port)},
    ).load_and_set(configuration)
    configuration.retries = 0
    return kubernetes.client.CoreV1Api(kubernetes.client.ApiClient(configuration))


def test_an_in_cluster_client_reaches_the_api_over_https(cluster, tmp_path):
    certificate = serving_certificate(tmp_path / "ca")
    port = cluster.serve_tls(certificate)
    core = in_cluster_client(certificate.ca_cert, port, tmp_path, cluster.admin_token)
    assert core.api_client.configuration.host == f"https://127.0.0.1:{port}"
    assert [n.metadata.name for n in core.list_node().items] == ["gpu-1"]


def test_a_client_trusting_another_ca_is_refused(cluster, tmp_path):
    port = cluster.serve_tls(serving_certificate(tmp_path / "ours"))
    other = serving_certificate(tmp_path / "other")
    core = in_cluster_client(other.ca_cert, port, tmp_path, cluster.admin_token)
    with pytest.raises(urllib3.exceptions.MaxRetryError, match="CERTIFICATE_VERIFY_FAILED"):
        core.list_node()


def test_a_pod_on_the_pod_network_reaches_the_https_api_at_the_gateway(cluster, tmp_path):
    # a pod's KUBERNETES_SERVICE_HOST is an address it can reach: the pod network's gateway,
    # where the plain API listens too, with the certificate naming that address
    certificate = serving_certificate(tmp_path / "ca", ips=("127.0.0.1", cluster.host_ip))
    port = cluster.serve_tls(certificate)
    core = in_cluster_client(
        certificate.ca_cert, port, tmp_path, cluster.admin_token, cluster.host_ip
    )
    assert [n.metadata.name for n in core.list_node().items] == ["gpu-1"]
