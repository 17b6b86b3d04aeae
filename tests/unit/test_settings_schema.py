"""The settings schema is plain JSON Schema, declares every key once, and everything written
from it (defaults.yaml, the README reference, the spawners' trait defaults) agrees with it."""

import os
from importlib.metadata import entry_points

import jsonschema
import pytest
import yaml
from traitlets.config import Config
from traitlets.utils.importstring import import_item

from billing_service.domain.money import MAX_COUNT
from gputap_common.settings import defaults, load_settings, node_at, schema, validate
from gputap_common.settings.__main__ import main
from gputap_common.settings.render import (
    DEFAULTS_COMMAND,
    DEFAULTS_FILE,
    README,
    REFERENCE_COMMAND,
    defaults_yaml,
    reference_markdown,
    with_reference,
)
from gputap_common.settings.schema import is_section, setting_paths
from gputap_common.settings.validate import SettingsError, unsupported_keywords
from hub_config.hub import apply

#: settings that hub_config.hub hands to a spawner trait: setting -> "Class.trait". The classes
#: are looked up in the spawner classes hub.py configures (c.JupyterHub.spawner_class), so a
#: move of the spawner modules changes nothing here.
TRAITS = {
    "spawner.queue_timeout": "GPUSpawnerMixin.queue_timeout",
    "spawner.disks.max_size_gb": "GPUSpawnerMixin.disk_max_size_gb",
    "spawner.disks.max_disks": "GPUSpawnerMixin.max_disks",
    "spawner.disks.storage_class": "GPUKubeSpawner.disk_storage_class",
    "spawner.inventory": "GPULocalSpawner.inventory",
    "spawner.run_as_system_user": "GPULocalSpawner.run_as_system_user",
    "catalog.cards": "GPUSpawnerMixin.catalog_cards",
}


def test_the_schema_is_valid_json_schema_and_its_defaults_pass_it():
    jsonschema.Draft7Validator.check_schema(schema())
    jsonschema.Draft7Validator(schema()).validate(defaults())
    validate(defaults())


def test_the_schema_uses_only_what_the_validator_checks():
    assert list(unsupported_keywords(schema())) == []


def walk(node, path=()):
    for key, child in node.get("properties", {}).items():
        yield (*path, key), child
        yield from walk(child, (*path, key))
    for word in ("items", "additionalProperties"):
        if isinstance(node.get(word), dict):
            yield from walk(node[word], (*path, word))


def test_every_key_has_type_and_description_and_every_value_a_default():
    for path, node in walk(schema()):
        assert "type" in node and node.get("description"), path
        if is_section(node):
            assert node.get("additionalProperties") is False, path
        inside = "items" in path or "additionalProperties" in path
        if not is_section(node) and not inside:
            assert "default" in node, path


def test_patterns_are_anchored_at_both_ends():
    def patterns(node):
        if "pattern" in node:
            yield node["pattern"]
        for child in node.get("properties", {}).values():
            yield from patterns(child)
        for word in ("items", "additionalProperties", "propertyNames"):
            if isinstance(node.get(word), dict):
                yield from patterns(node[word])

    for pattern in patterns(schema()):
        assert pattern.startswith("^") and pattern.endswith("$"), pattern
        assert "$" not in pattern[:-1], pattern


@pytest.mark.parametrize(
    "settings",
    [
        {"spawner": {"queue_timout": 1}},
        {"hub": {"port": 0}},
        {"hub": {"port": "80"}},
        {"hub": {"github": {"url": "github.example.org"}}},
        {"hub": {"services": [{"name": "ops"}]}},
        {"hub": {"services": [{"name": "ops", "api_token": "t", "scopes": ["read:users"]}]}},
        {"spawner": {"backend": "k8s"}},
        {"spawner": {"kubernetes": {"namespace": "Bad_Namespace"}}},
        {"spawner": {"environment": {"HF_HOME": "/data", "THREADS": 4}}},
        {"spawner": {"environment": {"HF-HOME": "/data"}}},
        {"billing": {"trial_credit": "-1"}},
        {"billing": {"trial_credit": -1}},
        {"billing": {"trial_credit": 2.5}},
        {"billing": {"prices": {"B200": "20.00", "A100-80GB/1g.10gb": 1}}},
        {"billing": {"prices": {"B200": "twenty"}}},
        {"billing": {"warning_minutes": [15, 0]}},
        {"catalog": {"cards": {"RTX 5090": {}}}},
        {"catalog": {"cards": {"X": {"memroy_gb": 3}}}},
        {"catalog": {"cards": {"X": {"mig_profiles": {"1g.5gb": 7}}}}},
        {"catalog": {"cards": {"X": {"mig_profiles": {"1g.5gb": 8}}}}},
        {"courses": {"instructor_teams": ["uni:teachers"]}},
        {"courses": {"instructor_teams": ["uni"]}},
        {"idle": {"enabled": "yes"}},
    ],
)
def test_it_refuses_exactly_what_a_json_schema_validator_refuses(settings):
    """The Helm chart validates the same values with a JSON Schema validator."""
    theirs = not list(jsonschema.Draft7Validator(schema()).iter_errors(settings))
    try:
        validate(settings)
        ours = True
    except SettingsError:
        ours = False
    assert ours == theirs


def test_disks_stay_within_what_billing_meters():
    assert node_at(("spawner", "disks", "max_size_gb"))["maximum"] == MAX_COUNT


def test_defaults_yaml_is_generated_from_the_schema():
    assert DEFAULTS_FILE.read_text() == defaults_yaml(), f"regenerate it: {DEFAULTS_COMMAND}"
    assert yaml.safe_load(defaults_yaml()) == defaults()
    assert all(len(line) <= 100 for line in defaults_yaml().splitlines())


def test_readme_reference_is_generated_from_the_schema():
    readme = README.read_text()
    assert with_reference(readme) == readme, f"regenerate it: {REFERENCE_COMMAND}"
    reference = reference_markdown()
    for path in setting_paths():
        assert f"`{path}`" in reference, path


@pytest.fixture(scope="module")
def configured(tmp_path_factory):
    """hub_config.hub's configuration at the defaults, per backend."""
    data = tmp_path_factory.mktemp("data")
    configs = {}
    for backend in ("local", "kubernetes"):
        c = Config()
        environ = {
            "GPUTAP__DATA_DIR": str(data),
            "GPUTAP__SPAWNER__BACKEND": backend,
            # the Kubernetes backend needs an address pods reach (docs/kubernetes.md)
            "GPUTAP__SPAWNER__KUBERNETES__HUB_IP": "10.42.0.1",
        }
        apply(c, load_settings(environ=environ))
        configs[backend] = c
    return configs


def spawner_class(name: str) -> type:
    """What JupyterHub makes of c.JupyterHub.spawner_class: an entry point's short name of
    the jupyterhub.spawners group, or an import string."""
    if "." not in name:
        [point] = entry_points(group="jupyterhub.spawners", name=name)
        return point.load()
    return import_item(name)


@pytest.mark.parametrize("setting, target", TRAITS.items())
def test_spawner_trait_defaults_are_the_schema_defaults(configured, setting, target):
    classes = {}
    for c in configured.values():
        for cls in spawner_class(c.JupyterHub.spawner_class).__mro__:
            classes.setdefault(cls.__name__, cls)
    name, trait = target.split(".")
    default = node_at(tuple(setting.split(".")))["default"]
    assert classes[name].class_traits()[trait].default() == default
    # and the hub hands the setting to that trait
    assert configured["local"][name][trait] == default


def test_the_hub_polls_servers_as_often_as_the_setting_says(configured, tmp_path):
    """JupyterHub's own default is 30 s; gputap's 10 s on both backends, or the setting."""
    for backend, c in configured.items():
        assert c.Spawner.poll_interval == 10, backend
    c = Config()
    environ = {"GPUTAP__DATA_DIR": str(tmp_path), "GPUTAP__SPAWNER__POLL_INTERVAL_SECONDS": "2"}
    apply(c, load_settings(environ=environ))
    assert c.Spawner.poll_interval == 2


def test_the_command_checks_a_settings_file(tmp_path, capsys, monkeypatch):
    for name in [n for n in os.environ if n.startswith("GPUTAP")]:
        monkeypatch.delenv(name)
    f = tmp_path / "gputap.yaml"
    f.write_text("spawner:\n  queue_timout: 7200\n")
    assert main(["check", str(f)]) == 1
    assert "did you mean spawner.queue_timeout?" in capsys.readouterr().err
    f.write_text("spawner:\n  queue_timeout: 7200\n")
    assert main(["check", str(f)]) == 0
    assert capsys.readouterr().out == f"settings OK ({f})\n"
    assert main(["defaults"]) == 0 and capsys.readouterr().out == defaults_yaml()
