"""GitHub's client secret reaches the hub and nothing else: given to the hub in its
environment (GPUTAP__HUB__GITHUB__CLIENT_SECRET, as docs/github.md advises), it signs people
in, while the billing service the hub starts has it neither in its environment nor in the
settings it loads."""

import secrets

import pytest
import requests

from billing_service.config import load_billing_settings
from tests.github_sim import GitHubSim
from tests.github_sim.client import sign_in
from tests.github_sim.hub import hub_settings
from tests.platform import Platform, billing_process

SECRET = f"client-secret-{secrets.token_hex(8)}"


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    github = GitHubSim(client_secret=SECRET)
    github.add_user("hana")
    with github.in_thread():
        extra = hub_settings(github)
        del extra["hub"]["github"]["client_secret"]  # only in the hub's environment
        p = Platform(
            tmp_path_factory.mktemp("github-secret"),
            extra=extra,
            env={"GPUTAP__HUB__GITHUB__CLIENT_SECRET": SECRET},
        )
        p.start()
        yield p
        p.shutdown()


def test_the_client_secret_signs_in_at_the_hub_and_never_reaches_billing(hub):
    r = sign_in(requests.Session(), f"{hub.url}/hub/oauth_login", "hana")
    assert r.status_code == 200, r.text  # the hub had the secret: GitHub took it

    billing = billing_process(hub)
    environ = billing.environ()
    assert not [name for name, value in environ.items() if SECRET in value]
    assert not [name for name in environ if name.startswith("GPUTAP__")]
    # what billing loads: its settings file and the environment it runs in
    settings = load_billing_settings(environ=environ)
    assert SECRET not in repr(settings.raw)
    assert settings.source is not None and SECRET not in settings.source.read_text()
    assert settings.billing["port"] == hub.billing_port
