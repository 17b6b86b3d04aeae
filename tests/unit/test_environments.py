"""The environment catalog: its settings checked at start-up with a message naming the key, the
choice a start asks for, and what an environment needs of the GPU asked for."""

import stat

import pytest
import yaml
from traitlets.config import Config

from gputap_common.settings import SettingsError, load_settings
from hub_config.hub import apply
from spawner.core.catalog import load_catalog
from spawner.core.environments import (
    Environment,
    Environments,
    environments_from_settings,
    fit_request,
)
from spawner.core.placement import (
    CardRequest,
    CpuRequest,
    RequestError,
    SharedRequest,
    SliceRequest,
    SpecRequest,
)
from spawner.local.environments import NoSingleuser, singleuser_of

TORCH = {"name": "PyTorch", "image": "quay.io/acme/torch:2.13", "python": "/opt/torch"}


def loaded(tmp_path, settings: dict, **environ: str):
    path = tmp_path / "gputap.yaml"
    path.write_text(yaml.safe_dump({"data_dir": str(tmp_path / "data"), **settings}))
    return load_settings(path, environ=environ)


def start_up(tmp_path, settings: dict, backend: str = "local") -> Config:
    """The hub's configuration from ``settings``, as jupyterhub_config.py makes it."""
    spawner = {"backend": backend, **settings.pop("spawner", {})}
    if backend == "kubernetes":
        spawner.setdefault("kubernetes", {})["hub_ip"] = "10.42.0.1"
    c = Config()
    apply(c, loaded(tmp_path, {"spawner": spawner, **settings}))
    return c


def refused_at_start(tmp_path, settings: dict, backend: str = "local") -> str:
    with pytest.raises(SettingsError) as refused:
        start_up(tmp_path, settings, backend)
    return str(refused.value)


def python_environment(root):
    """A venv-shaped folder holding a runnable bin/jupyterhub-singleuser."""
    program = root / "bin" / "jupyterhub-singleuser"
    program.parent.mkdir(parents=True)
    program.write_text("#!/bin/sh\n")
    program.chmod(program.stat().st_mode | stat.S_IXUSR)
    return program


# -- the settings ----------------------------------------------------------------------------


def test_the_default_catalog_is_gputaps_own_environment(tmp_path):
    c = start_up(tmp_path, {})
    catalog = environments_from_settings(c.GPUSpawnerMixin.environments, "local")
    assert list(catalog.by_key) == ["gputap"]
    own = catalog.default
    assert (own.key, own.image, own.python, own.for_everyone) == ("gputap", "", "", True)
    # "" runs what the backend is configured with: the hub's venv, spawner.kubernetes.image
    assert c.Spawner.cmd[-1].endswith("/jupyterhub-singleuser")
    kube = start_up(tmp_path, {}, "kubernetes")
    assert kube.KubeSpawner.image == "gputap/singleuser:latest"


def test_an_operators_environments_join_the_default_one(tmp_path):
    program = python_environment(tmp_path / "torch")
    torch = {**TORCH, "python": str(tmp_path / "torch"), "needs": {"gpu": True}}
    c = start_up(tmp_path, {"environments": {"torch": torch}})
    catalog = environments_from_settings(c.GPUSpawnerMixin.environments, "local")
    assert sorted(catalog.by_key) == ["gputap", "torch"]
    assert catalog.by_key["torch"].needs_gpu and catalog.default.key == "gputap"
    assert singleuser_of(catalog.by_key["torch"].python) == program


@pytest.mark.parametrize(
    "environments, message",
    [
        (
            {"torch": {**TORCH, "imgae": "x"}},
            "environments.torch.imgae is not a setting; did you mean environments.torch.image?",
        ),
        (
            {"torch": {**TORCH, "image": "Acme/Torch:latest"}},
            "environments.torch.image must be a container image reference",
        ),
        (
            {"torch": {**TORCH, "image": "acme/torch:2\n"}},
            "environments.torch.image must be a container image reference",
        ),
        ({"Torch": TORCH}, "'Torch' must be an environment key of lower-case letters"),
        (
            {"torch": {**TORCH, "needs": {"min_gpu_memory_gb": -1}}},
            "environments.torch.needs.min_gpu_memory_gb must be a number >= 0",
        ),
        (
            {"torch": {**TORCH, "allowed": {"courses": ["Deep Learning"]}}},
            "environments.torch.allowed.courses[0] must be a course slug",
        ),
    ],
)
def test_a_malformed_environment_is_refused_naming_its_key(tmp_path, environments, message):
    with pytest.raises(SettingsError) as refused:
        loaded(tmp_path, {"environments": environments})
    assert message in str(refused.value)


def test_a_new_environment_needs_a_name(tmp_path):
    message = refused_at_start(tmp_path, {"environments": {"torch": {"image": "acme/torch"}}})
    assert message == "environments.torch needs name: what users see, e.g. PyTorch 2.13 (CUDA 12.8)"
    # a default entry's keys may be changed alone: it has its name
    c = start_up(tmp_path, {"environments": {"gputap": {"tags": ["minimal"]}}})
    assert c.GPUSpawnerMixin.environments["gputap"]["name"] == "gputap minimal"


def test_two_defaults_are_refused_naming_both(tmp_path):
    message = refused_at_start(tmp_path, {"environments": {"torch": {**TORCH, "default": True}}})
    assert message.startswith(
        "environments.gputap and environments.torch are each the default; set default: false"
    )


def test_no_default_is_refused(tmp_path):
    message = refused_at_start(tmp_path, {"environments": {"gputap": {"default": False}}})
    assert message.startswith("environments: none is the default; set default: true on one")


def test_a_default_that_not_everyone_may_use_is_refused(tmp_path):
    settings = {"environments": {"gputap": {"allowed": {"groups": ["staff"]}}}}
    message = refused_at_start(tmp_path, settings)
    assert message.startswith("environments.gputap is the default but allowed only to some")


def test_one_machine_refuses_an_environment_without_its_singleuser(tmp_path):
    missing = {**TORCH, "python": str(tmp_path / "nowhere")}
    message = refused_at_start(tmp_path, {"environments": {"torch": missing}})
    assert message == (
        f"environments.torch.python: no runnable jupyterhub-singleuser at "
        f"{tmp_path}/nowhere/bin/jupyterhub-singleuser or {tmp_path}/nowhere/jupyterhub-singleuser"
    )
    image_only = {"name": "PyTorch", "image": "acme/torch:2"}
    message = refused_at_start(tmp_path, {"environments": {"torch": image_only}})
    assert message.startswith("environments.torch has an image (acme/torch:2) but no python")
    relative = {**TORCH, "python": "envs/torch"}
    message = refused_at_start(tmp_path, {"environments": {"torch": relative}})
    assert message == "environments.torch.python: 'envs/torch' is not an absolute path"


def test_kubernetes_refuses_an_environment_without_an_image(tmp_path):
    python_only = {"name": "PyTorch", "python": "/opt/torch"}
    message = refused_at_start(tmp_path, {"environments": {"torch": python_only}}, "kubernetes")
    assert message.startswith("environments.torch has a python (/opt/torch) but no image")
    # the python of a catalog shared with one machine is not looked for on Kubernetes
    c = start_up(tmp_path, {"environments": {"torch": TORCH}}, "kubernetes")
    assert "torch" in c.GPUSpawnerMixin.environments


def test_free_text_images_are_kubernetes_only_and_their_pattern_a_regex(tmp_path):
    pattern = {"spawner": {"kubernetes": {"image_pattern": "ghcr\\.io/acme/.+"}}}
    message = refused_at_start(tmp_path, dict(pattern))
    assert message.startswith("spawner.kubernetes.image_pattern allows free-text images")
    c = start_up(tmp_path, dict(pattern), "kubernetes")
    assert c.GPUSpawnerMixin.image_pattern == "ghcr\\.io/acme/.+"
    broken = {"spawner": {"kubernetes": {"image_pattern": "ghcr.io/(acme"}}}
    message = refused_at_start(tmp_path, broken, "kubernetes")
    assert message.startswith("spawner.kubernetes.image_pattern is not a regular expression")


def test_singleuser_is_found_in_a_venv_its_bin_folder_or_named_itself(tmp_path):
    program = python_environment(tmp_path / "env")
    for given in (tmp_path / "env", tmp_path / "env" / "bin", program):
        assert singleuser_of(str(given)) == program
    program.chmod(0o644)
    with pytest.raises(NoSingleuser, match="no runnable jupyterhub-singleuser"):
        singleuser_of(str(tmp_path / "env"))


# -- the choice of a start -------------------------------------------------------------------

CATALOG = Environments(
    [
        Environment("gputap", "gputap minimal", default=True),
        Environment("torch", "PyTorch", needs_gpu=True, min_gpu_memory_gb=20),
        Environment("staff", "Staff's", groups=("acme:staff",)),
        Environment("dl", "Deep learning course", courses=("dl-2026",)),
    ]
)


def test_no_environment_is_the_default_and_a_named_one_is_that():
    assert CATALOG.choose("", "", [], []).key == "gputap"
    assert CATALOG.choose("torch", "", [], []).key == "torch"


def test_an_unknown_environment_names_those_the_user_may_use():
    with pytest.raises(RequestError) as refused:
        CATALOG.choose("tensorflow", "", [], [])
    assert str(refused.value) == (
        "environment 'tensorflow' is not an environment here; you may use: gputap, torch"
    )
    with pytest.raises(RequestError) as refused:
        CATALOG.choose("t" * 10_000, "", [], [])
    assert "(10000 characters)" in str(refused.value) and "t" * 100 not in str(refused.value)


def test_groups_and_courses_open_their_environments_and_only_theirs():
    with pytest.raises(
        RequestError, match="'staff' is not one of yours; you may use: gputap, torch"
    ):
        CATALOG.choose("staff", "", ["acme:ml"], [])
    assert CATALOG.choose("staff", "", ["Acme:Staff"], []).key == "staff"  # teams: lower case
    with pytest.raises(RequestError, match="'dl' is not one of yours"):
        CATALOG.choose("dl", "", ["acme:staff"], ["other-course"])
    assert CATALOG.choose("dl", "", [], ["dl-2026"]).key == "dl"
    with pytest.raises(RequestError, match="you may use: dl, gputap, staff, torch$"):
        CATALOG.choose("nope", "", ["acme:staff"], ["dl-2026"])


def test_free_text_images_only_where_allowed_and_matched_whole():
    with pytest.raises(RequestError, match="free-text images are not allowed here"):
        CATALOG.choose("", "python:3.12", [], [])
    open_catalog = Environments(list(CATALOG.by_key.values()), r"ghcr\.io/acme/[a-z0-9/-]+:[0-9.]+")
    chosen = open_catalog.choose("", "ghcr.io/acme/lab:1.2", [], [])
    assert (chosen.key, chosen.image) == ("image:ghcr.io/acme/lab:1.2", "ghcr.io/acme/lab:1.2")
    assert open_catalog.resolve(chosen.key).image == "ghcr.io/acme/lab:1.2"
    for image in ("ghcr.io/acme/lab:1.2\n", "docker.io/evil/lab:1", "ghcr.io/acme/lab:1.2;x"):
        with pytest.raises(RequestError, match="is not allowed here: it must match"):
            open_catalog.choose("", image, [], [])
    with pytest.raises(RequestError, match="send environment or image, not both"):
        open_catalog.choose("torch", "ghcr.io/acme/lab:1.2", [], [])


def test_what_an_environment_needs_of_the_gpu_asked_for():
    catalog = load_catalog({})
    torch = CATALOG.by_key["torch"]
    with pytest.raises(RequestError, match="environment torch needs a GPU; choose a card"):
        fit_request(torch, CpuRequest(), catalog)
    with pytest.raises(
        RequestError,
        match="needs ≥ 20 GB of GPU memory; A100-80GB 1g.10gb slice has 10 GB",
    ):
        fit_request(torch, SliceRequest("A100-80GB", "1g.10gb"), catalog)
    with pytest.raises(RequestError, match="a shared GPU guarantees none"):
        fit_request(torch, SharedRequest("T4"), catalog)
    assert fit_request(torch, CardRequest("A100-80GB"), catalog) == CardRequest("A100-80GB")
    slice_ = SliceRequest("A100-80GB", "3g.40gb")
    assert fit_request(torch, slice_, catalog) == slice_
    # a spec asks for at least what the environment needs
    assert fit_request(torch, SpecRequest(8, 50, 2), catalog) == SpecRequest(20, 50, 2)
    assert fit_request(torch, SpecRequest(40), catalog) == SpecRequest(40)
    # the default needs nothing
    assert fit_request(CATALOG.default, CpuRequest(), catalog) == CpuRequest()
