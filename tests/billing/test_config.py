import pytest

from billing_service.config import billing_config, load_billing_settings
from gputap_common.settings import load_settings


def test_defaults_are_valid():
    config = billing_config(load_settings(environ={}).billing)
    assert config.trial_credit_micro == 10_000_000
    assert config.min_billable_seconds == 300
    assert config.price_book.price("RTX-4090") == 5_000_000
    # the pod meter: $KUBECONFIG or in-cluster, running pods recorded every 10 s
    assert (config.kubeconfig, config.meter_seen_interval_seconds) == ("", 10.0)
    assert config.meter_start_grace_seconds == 30.0


def test_env_override_reaches_billing():
    # YAML parses 2.5 as a float; it must still become exactly 2_500_000 micro-credits
    environ = {
        "GPUTAP__BILLING__TRIAL_CREDIT": "2.5",
        "GPUTAP__BILLING__MIN_BILLABLE_SECONDS": "60",
    }
    config = billing_config(load_settings(environ=environ).billing)
    assert config.trial_credit_micro == 2_500_000
    assert config.min_billable_seconds == 60


@pytest.mark.parametrize(
    "key, value",
    [
        ("trial_credit", "-1"),
        ("min_billable_seconds", 0),
        ("enforce_interval_seconds", "soon"),
        ("database_url", ""),
        ("kubeconfig", 5),
        ("meter_seen_interval_seconds", 0),
        ("meter_start_grace_seconds", -1),
    ],
)
def test_bad_settings_name_the_key(key, value):
    section = {**load_settings(environ={}).billing, key: value}
    with pytest.raises(ValueError, match=key):
        billing_config(section)


def test_billing_keeps_none_of_the_hubs_settings(tmp_path):
    """Run outside the hub with the operator's whole settings file and environment, billing
    still never holds GitHub's client secret (or the hub's tokens): it drops the hub's
    section when it loads."""
    settings_file = tmp_path / "gputap.yaml"
    settings_file.write_text(
        "hub:\n  github: {client_id: app, client_secret: in-the-file}\n"
        "  services: [{name: ops, api_token: ops-token, scopes: [read:users]}]\n"
        "billing: {trial_credit: '3'}\n"
    )
    environ = {
        "GPUTAP_SETTINGS": str(settings_file),
        "GPUTAP__HUB__GITHUB__CLIENT_SECRET": "in-the-environment",
    }
    settings = load_billing_settings(environ=environ)
    kept = repr(settings.raw)
    for secret in ("in-the-file", "in-the-environment", "ops-token"):
        assert secret not in kept
    assert "hub" not in settings.raw
    assert settings.billing["trial_credit"] == "3" and settings.spawner["backend"] == "local"
