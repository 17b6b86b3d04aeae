"""The idle culler's wrapper (hub_config/idle_culler.py): its server stops go to gputap's stop
endpoint, which records that the culler asked; everything else goes out unchanged."""

import subprocess
import sys

from tornado.httpclient import HTTPRequest

from hub_config.idle_culler import gputap_stop

API = "http://127.0.0.1:8081/prefix/hub/api"
HEADERS = {"Authorization": "token secret"}


def test_a_server_delete_becomes_gputaps_stop_with_the_same_token():
    for path, stop in [
        ("users/ada/server", "users/ada/server/stop"),
        ("users/a%20b/servers/gpu%2F1", "users/a%20b/servers/gpu%2F1/stop"),
    ]:
        out = gputap_stop(HTTPRequest(f"{API}/{path}", method="DELETE", headers=HEADERS))
        assert (out.method, out.url) == (
            "POST",
            f"http://127.0.0.1:8081/prefix/hub/gputap/api/{stop}",
        )
        assert out.headers["Authorization"] == "token secret"


def test_other_requests_go_out_as_they_are():
    requests = [
        HTTPRequest(f"{API}/users?state=ready", headers=HEADERS),
        HTTPRequest(f"{API}/users/ada", method="DELETE", headers=HEADERS),  # culling the user
        HTTPRequest(
            f"{API}/users/ada/servers/gpu",
            method="DELETE",
            body=b'{"remove": true}',
            allow_nonstandard_methods=True,
        ),
    ]
    for request in requests:
        assert gputap_stop(request) is request


def test_the_culler_gets_the_wrapping_client_although_it_reconfigures_tornado():
    # what jupyterhub_idle_culler does: try pycurl, then configure(None, defaults=...)
    code = """
from tornado.httpclient import AsyncHTTPClient
from hub_config.idle_culler import GPUTapCullerClient, install
install()
try:
    AsyncHTTPClient.configure("tornado.curl_httpclient.CurlAsyncHTTPClient")
except ImportError:
    pass
AsyncHTTPClient.configure(None, defaults={"request_timeout": 5})
assert type(AsyncHTTPClient(force_instance=True)) is GPUTapCullerClient
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "ok", out.stderr
