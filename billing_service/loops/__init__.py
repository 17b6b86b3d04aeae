"""The background loops, each a pass every interval against the store and the outside world:
interval charges (:mod:`.charge`), enforcement through the hub (:mod:`.enforce`), reconciliation
with the hub (:mod:`.reconcile`) and, on Kubernetes, the pod meter (:mod:`.kube_meter`). Their
decisions are pure, in :mod:`billing_service.domain`."""


class KubeConfigMissing(RuntimeError):
    """No way to reach the Kubernetes API; the message says what to set. Here rather than in
    :mod:`.kube_meter`, so that billing on one machine never imports the Kubernetes client."""
