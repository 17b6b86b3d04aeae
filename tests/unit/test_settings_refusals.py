"""Settings that are not gputap's, or values a key cannot take, stop start-up with a message
that names the key as the operator wrote it, what it must be, and the nearest real key."""

import pytest
import yaml

from billing_service.config import billing_config
from gputap_common.settings import SettingsError, load_settings


def refusal(tmp_path=None, file: dict | None = None, **environ: str) -> str:
    path = None
    if file is not None:
        path = tmp_path / "gputap.yaml"
        path.write_text(yaml.safe_dump(file))
    with pytest.raises(SettingsError) as refused:
        load_settings(path, environ=environ)
    return str(refused.value)


# -- unknown keys ---------------------------------------------------------------------------


def test_misspelt_key_in_the_environment_names_the_variable_and_the_nearest_key():
    with pytest.raises(SettingsError) as refused:
        load_settings(environ={"GPUTAP__SPAWNER__QUEUE_TIMOUT": "7200"})
    assert str(refused.value) == (
        "GPUTAP__SPAWNER__QUEUE_TIMOUT: spawner.queue_timout is not a setting; "
        "did you mean spawner.queue_timeout?"
    )


def test_misspelt_key_in_the_file_names_the_file_and_the_nearest_key(tmp_path):
    f = tmp_path / "gputap.yaml"
    f.write_text("spawner:\n  queue_timout: 7200\n")
    with pytest.raises(SettingsError) as refused:
        load_settings(f, environ={})
    assert str(refused.value) == (
        f"{f}: spawner.queue_timout is not a setting; did you mean spawner.queue_timeout?"
    )


def test_a_key_in_the_wrong_section_is_pointed_at_the_right_one(tmp_path):
    assert refusal(GPUTAP__HUB__QUEUE_TIMEOUT="60").endswith(
        "hub.queue_timeout is not a setting; did you mean spawner.queue_timeout?"
    )
    assert refusal(tmp_path, {"billing": {"start_timeout": 60}}).endswith(
        "billing.start_timeout is not a setting; did you mean spawner.start_timeout?"
    )


def test_a_misspelt_section_in_a_variable_suggests_the_whole_path():
    assert refusal(GPUTAP__SPAWNR__QUEUE_TIMEOUT="60") == (
        "GPUTAP__SPAWNR__QUEUE_TIMEOUT: spawnr.queue_timeout is not a setting; "
        "did you mean spawner.queue_timeout?"
    )


def test_with_nothing_near_the_section_s_keys_are_listed():
    message = refusal(GPUTAP__IDLE__ZZZ="1")
    assert message == (
        "GPUTAP__IDLE__ZZZ: idle.zzz is not a setting; idle has: enabled, timeout_seconds, "
        "cull_every_seconds, activity_interval_seconds"
    )


def test_a_value_has_no_keys_inside():
    assert refusal(GPUTAP__HUB__PORT__NUMBER="1") == (
        "GPUTAP__HUB__PORT__NUMBER: hub.port is a whole number from 1 to 65535, with no keys "
        "inside; set GPUTAP__HUB__PORT itself"
    )


def test_keys_of_list_items_and_map_values_are_checked_too(tmp_path):
    services = {"hub": {"services": [{"name": "ops", "api_token": "t", "scope": ["x"]}]}}
    assert refusal(tmp_path, services).endswith(
        "hub.services[0].scope is not a setting; did you mean hub.services[0].scopes?"
    )
    card = {"catalog": {"cards": {"RTX-5090": {"memroy_gb": 32}}}}
    assert refusal(tmp_path, card).endswith(
        "catalog.cards.RTX-5090.memroy_gb is not a setting; "
        "did you mean catalog.cards.RTX-5090.memory_gb?"
    )
    assert refusal(tmp_path, {"hub": {"services": [{"name": "ops"}]}}).endswith(
        "hub.services[0] needs api_token: The token the client sends, e.g. the output of "
        "`openssl rand -hex 32`."
    )


def test_a_moved_key_names_its_new_place(tmp_path):
    github = {"hub": {"github": {"github_url": "https://ghe.example.org"}}}
    assert refusal(tmp_path, github).endswith("hub.github.github_url is now hub.github.url")


# -- values -------------------------------------------------------------------------------


def test_wrong_type_names_the_key_what_it_must_be_and_the_value(tmp_path):
    assert refusal(GPUTAP__HUB__PORT="eighty") == (
        "GPUTAP__HUB__PORT: hub.port must be a whole number from 1 to 65535, not 'eighty'"
    )
    assert refusal(tmp_path, {"idle": {"enabled": "yes"}}).endswith(
        "idle.enabled must be true or false, not 'yes'"
    )
    assert refusal(tmp_path, {"spawner": {"backend": "k8s"}}).endswith(
        "spawner.backend must be one of local, kubernetes, not 'k8s'"
    )
    # a whole number is an integer, not 60.0
    assert refusal(GPUTAP__SPAWNER__START_TIMEOUT="60.0").endswith(
        "spawner.start_timeout must be a whole number >= 1, not 60.0"
    )


def test_the_poll_interval_is_whole_seconds_from_one():
    # JupyterHub's Spawner.poll_interval is an Integer; 0 would stop polling altogether
    assert refusal(GPUTAP__SPAWNER__POLL_INTERVAL_SECONDS="0").endswith(
        "spawner.poll_interval_seconds must be a whole number >= 1, not 0"
    )
    assert refusal(GPUTAP__SPAWNER__POLL_INTERVAL_SECONDS="0.5").endswith(
        "spawner.poll_interval_seconds must be a whole number >= 1, not 0.5"
    )


def test_out_of_range_names_the_range(tmp_path):
    f = tmp_path / "gputap.yaml"
    assert refusal(tmp_path, {"hub": {"port": 70000}}) == (
        f"{f}: hub.port must be a whole number from 1 to 65535, not 70000"
    )
    assert refusal(GPUTAP__BILLING__CHARGE_INTERVAL_SECONDS="90").endswith(
        "billing.charge_interval_seconds must be a whole number from 1 to 60, not 90"
    )
    assert refusal(tmp_path, {"billing": {"warning_minutes": [15, -5]}}).endswith(
        "billing.warning_minutes[1] must be a number > 0, not -5"
    )
    assert refusal(GPUTAP__BILLING__TRIAL_CREDIT="-1").endswith(
        'billing.trial_credit must be credits as a decimal such as "10.00" (at most 6 '
        "decimals, not negative), not -1"
    )


def test_patterns_match_the_whole_value(tmp_path):
    assert refusal(tmp_path, {"spawner": {"kubernetes": {"namespace": "gputap\n"}}}).endswith(
        "spawner.kubernetes.namespace must be a Kubernetes namespace name (lower-case letters, "
        "digits and '-'), not 'gputap\\n'"
    )


def test_long_values_are_shortened():
    message = refusal(GPUTAP__SPAWNER__DEFAULT_URL="[" + "1, " * 300 + "1]")
    assert message.endswith("... (903 characters)")
    assert len(message) < 200


def test_secrets_are_never_shown(tmp_path):
    message = refusal(tmp_path, {"billing": {"api_token": 123456789}})
    assert message.endswith(
        "billing.api_token must be a string, not a number (not shown: it may be a secret)"
    )
    assert "123456789" not in message
    message = refusal(GPUTAP__HUB__GITHUB__CLIENT_SECRET="[hunter2]")
    assert "hunter2" not in message and "hub.github.client_secret must be a string" in message
    environment = {"spawner": {"environment": {"AWS_SECRET_ACCESS_KEY": ["hunter2"]}}}
    assert "hunter2" not in refusal(tmp_path, environment)
    # nor a password inside a URL
    message = refusal(GPUTAP__HUB__GITHUB__URL="ftp://me:hunter2@ghe.example.org")
    assert "hunter2" not in message and "'ftp://me:***@ghe.example.org'" in message


# -- free-form maps -----------------------------------------------------------------------


def test_prices_take_new_keys_and_the_environment_matches_existing_ones(tmp_path):
    s = load_settings(environ={"GPUTAP__BILLING__PRICES__T4": "2.0"})
    assert s.billing["prices"]["T4"] == 2.0 and "t4" not in s.billing["prices"]
    assert billing_config(s.billing).price_book.price("T4") == 2_000_000
    f = tmp_path / "gputap.yaml"
    f.write_text("billing:\n  prices:\n    RTX-5090: '6.50'\n")
    s = load_settings(f, environ={"GPUTAP__BILLING__PRICES__B200": "20.00"})
    assert s.billing["prices"]["RTX-5090"] == "6.50" and s.billing["prices"]["B200"] == 20.0
    assert s.billing["prices"]["T4"] == "1.50"  # the defaults stay beside them
    assert billing_config(s.billing).price_book.price("B200") == 20_000_000


def test_map_values_and_map_keys_follow_the_maps_rule(tmp_path):
    assert refusal(GPUTAP__BILLING__PRICES__B200="lots").endswith(
        'billing.prices.B200 must be credits as a decimal such as "1.50" (at most 6 decimals, '
        "not negative), not 'lots'"
    )
    assert refusal(tmp_path, {"spawner": {"environment": {"HF-HOME": "/data"}}}).endswith(
        "spawner.environment: 'HF-HOME' must be an environment variable name (letters, digits "
        "and '_')"
    )
    s = load_settings(environ={"GPUTAP__SPAWNER__ENVIRONMENT__HF_HOME": "/data/hf"})
    assert s.spawner["environment"] == {"HF_HOME": "/data/hf"}


def test_a_section_with_nothing_under_it_sets_nothing(tmp_path):
    f = tmp_path / "gputap.yaml"
    f.write_text("spawner:\ncatalog:\n  cards:\n")
    s = load_settings(f, environ={})
    assert s.spawner["queue_timeout"] == 3600 and s.catalog["cards"] == {}
