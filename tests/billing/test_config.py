import pytest

from billing_service.config import billing_config
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
