"""spawner.disks settings become the spawners' traits, the disk API and its scope."""

import pytest
from traitlets.config import Config

from gputap_common.scopes import DISKS as DISKS_SCOPE
from gputap_common.settings import SettingsError, load_settings
from hub_config.hub import apply
from spawner.api import disks as disk_api


def configured(tmp_path, **env) -> Config:
    f = tmp_path / "g.yaml"
    f.write_text(f"data_dir: {tmp_path}\n")
    c = Config()
    apply(c, load_settings(f, environ={f"GPUTAP__SPAWNER__DISKS__{k}": v for k, v in env.items()}))
    return c


def test_defaults_reach_the_spawners_and_users_may_use_their_own_disks(tmp_path):
    c = configured(tmp_path)
    assert c.GPUSpawnerMixin.disk_max_size_gb == 100 and c.GPUSpawnerMixin.max_disks == 5
    assert c.GPULocalSpawner.disk_root == f"{tmp_path}/disks"
    assert c.GPUKubeSpawner.disk_storage_class == ""
    assert all(h in c.JupyterHub.extra_handlers for h in disk_api.default_handlers)
    # the API checks the scope the hub defines, which every user holds on themselves
    assert disk_api.scopes.DISKS == DISKS_SCOPE and DISKS_SCOPE in c.JupyterHub.custom_scopes
    [user_role] = [r for r in c.JupyterHub.load_roles if r["name"] == "user"]
    assert user_role["scopes"].count(f"{DISKS_SCOPE}!user") == 1


def test_operators_set_limits_and_storage_class(tmp_path):
    c = configured(tmp_path, MAX_SIZE_GB="500", MAX_DISKS="1", STORAGE_CLASS="fast-ssd")
    assert c.GPUSpawnerMixin.disk_max_size_gb == 500 and c.GPUSpawnerMixin.max_disks == 1
    assert c.GPUKubeSpawner.disk_storage_class == "fast-ssd"


@pytest.mark.parametrize("key,value", [("MAX_SIZE_GB", "0"), ("MAX_DISKS", "many")])
def test_bad_limits_name_the_key(tmp_path, key, value):
    with pytest.raises(SettingsError, match=f"spawner.disks.{key.lower()}"):
        configured(tmp_path, **{key: value})
