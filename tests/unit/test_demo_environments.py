"""`make demo` offers the data-science environment `make setup` built (hub_config/environments.py)
beside gputap's own, unless the settings name one of that key; its servers' packages are
gputap's own at pyproject.toml's ranges."""

from importlib.metadata import version

from packaging.requirements import Requirement

from gputap_common.settings import load_settings
from hub_config import demo
from hub_config.environments import (
    DATA_SCIENCE_KEY,
    DATA_SCIENCE_PACKAGES,
    demo_environments,
    main,
    server_requirements,
)
from spawner.core.environments import environments_from_settings
from tests.unit.test_environments import python_environment


def built(root):
    """A built environment's folder (its bin/jupyterhub-singleuser runnable)."""
    python_environment(root)
    return root


def settings_with(tmp_path, environ, text=""):
    f = tmp_path / "s.yaml"
    f.write_text(f"data_dir: {tmp_path}\n{text}")
    return load_settings(f, environ=environ)


def test_a_built_data_science_environment_joins_the_demos_catalog(tmp_path):
    env = built(tmp_path / "ds")
    given = settings_with(tmp_path, {})
    settings = settings_with(tmp_path, demo_environments(given.environments, env))
    catalog = environments_from_settings(settings.environments, "local")
    ds = catalog.by_key[DATA_SCIENCE_KEY]
    assert ds.python == str(env) and ds.framework == "PyTorch" and "pytorch-2.13" in ds.tags
    assert catalog.default.key == "gputap"  # still the default
    assert f"Data science (PyTorch 2.13 CPU) ({DATA_SCIENCE_KEY})" in demo.environments_text(
        settings
    )


def test_none_when_not_built_or_when_the_settings_have_their_own(tmp_path):
    assert demo_environments({"gputap": {}}, tmp_path / "missing") == {}
    own = {"gputap": {}, DATA_SCIENCE_KEY: {"name": "Ours"}}
    assert demo_environments(own, built(tmp_path / "ds")) == {}


def test_the_environments_servers_get_gputaps_server_packages_at_its_ranges(capsys):
    lines = server_requirements()
    assert lines[0] == f"jupyterhub=={version('jupyterhub')}"
    names = [Requirement(line).name for line in lines[1:]]
    assert names == ["jupyterlab", "nvidia-ml-py", "jupyter-server-proxy", "tensorboard"]
    assert main(["requirements"]) == 0
    printed = capsys.readouterr().out.split()
    assert printed == [*lines, *DATA_SCIENCE_PACKAGES] and "torch==2.13.0" in printed
    assert main([]) == 2
