"""A GPU fault in open Lab on Kubernetes, in Chromium (docs/gpu-faults.md): the device plugin
marks the server's GPU Unhealthy, Lab tells the user at once that billing stopped, and reloads
on its own once the server runs again in a new pod on a healthy GPU."""

import re

import pytest
from playwright.sync_api import expect

from tests.browser.conftest import browser  # noqa: F401 (the fixture)
from tests.browser.test_lab_e2e import log_in, open_panel
from tests.kube.conftest import gputap_cluster, kube_platform
from tests.kube.test_kube_gpu_faults import L40S, device_of


@pytest.fixture(scope="module")
def cluster(chart_rbac):
    with gputap_cluster(chart_rbac, seed=13) as c:
        c.gpu_node("gpu-l40s", product="NVIDIA-L40S", gpus=2, memory_mib=46068)
        yield c


@pytest.fixture(scope="module")
def platform(cluster, tmp_path_factory):
    p = kube_platform(cluster, tmp_path_factory.mktemp("kube-fault-lab"))
    p.start()
    yield p
    p.shutdown()


def test_a_gpu_fault_is_told_in_lab_and_lab_comes_back_in_a_new_pod(platform, cluster, browser):  # noqa: F811
    platform.create_user("kim")
    assert platform.spawn("kim", L40S).status_code in (201, 202)
    platform.wait_ready("kim", timeout=90)
    node, device = device_of(cluster, "kim")
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.set_default_timeout(90_000)
    log_in(page, platform.url, "kim")
    page.goto(f"{platform.url}/user/kim/lab")
    open_panel(page)

    cluster.gpu_fault(node, int(device.rsplit("-", 1)[1]))
    # one look: the recovery is quick here, and the reload takes the notice away
    told = re.compile(r"The GPU of your server failed at .*Billing stopped at that second", re.S)
    expect(page.locator(".Toastify__toast").filter(has_text=told)).to_be_visible(timeout=30_000)

    back = page.locator(".Toastify__toast").filter(has_text="back on a healthy GPU")
    expect(back).to_be_visible(timeout=120_000)
    assert device_of(cluster, "kim")[1] != device
    page.close()
    platform.stop_server("kim")
