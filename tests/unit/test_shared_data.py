"""Shared data, read-only: the settings' rules (each refusal naming the key), the pod's volumes
and the servers' environment, and on one machine the links and the start-up check of who may
write a shared folder."""

import errno
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from traitlets.config import Config

from gputap_common.settings import SettingsError, settings_from_mapping
from gputap_common.settings.shared_data import RESERVED
from hub_config.shared_data import configure_shared_data
from spawner.core.disks import HOME_FOLDER
from spawner.core.shared_data import shared_data_env
from spawner.kube.disks import MOUNT_ROOT
from spawner.kube.shared_data import shared_data_pod_settings
from spawner.local.shared_data import folder_problem, link_shared_data

NOBODY = 65534


def kube(*entries, **spawner):
    return settings_from_mapping(
        {"spawner": {"backend": "kubernetes", **spawner}, "shared_data": list(entries)},
        "test",
        environ={},
    )


def local(*entries, **spawner):
    return settings_from_mapping(
        {"spawner": spawner, "shared_data": list(entries)}, "test", environ={}
    )


MODELS = {"name": "hf", "mount_path": "/models", "kind": "models", "claim": "hf-models"}


# -- settings --------------------------------------------------------------------------------


def test_an_entry_gets_its_defaults():
    [entry] = kube(
        {"name": "imagenet", "mount_path": "/datasets/imagenet", "claim": "i"}
    ).shared_data
    assert entry == {
        "name": "imagenet",
        "mount_path": "/datasets/imagenet",
        "kind": "datasets",
        "folder": "",
        "claim": "i",
        "nfs_server": "",
        "nfs_path": "",
    }


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        ([{**MODELS, "mount_path": "models"}], "shared_data[0].mount_path must be an absolute"),
        ([{**MODELS, "mount_path": "/models/"}], "shared_data[0].mount_path must be an absolute"),
        ([{**MODELS, "mount_path": "/a/../etc"}], "shared_data[0].mount_path must be an absolute"),
        (
            [{**MODELS, "mount_path": "/"}],
            "such as /models (folders of letters, digits, '.', '_', '-'), not '/'",
        ),
        ([{**MODELS, "mount_path": "/usr/share/models"}], "would cover or sit in /usr"),
        ([{**MODELS, "mount_path": "/home/jovyan/models"}], "would cover or sit in /home"),
        ([{**MODELS, "mount_path": "/mnt"}], "would cover or sit in /mnt/disks"),
        ([{**MODELS, "mount_path": "/disks"}], "would cover or sit in /disks"),
        ([{**MODELS, "mount_path": "/tmp"}], "would cover or sit in /tmp"),
        ([{**MODELS, "name": "Models"}], "shared_data[0].name must be a name of lower-case"),
        ([{**MODELS, "kind": "weights"}], "shared_data[0].kind must be one of models, datasets"),
        ([{**MODELS, "size": 3}], "shared_data[0].size is not a setting"),
        ([{"name": "hf", "claim": "c"}], "shared_data[0] needs mount_path"),
        (
            [MODELS, {**MODELS, "mount_path": "/other"}],
            "shared_data[1].name 'hf' is also shared_data[0]'s",
        ),
        (
            [MODELS, {"name": "sub", "mount_path": "/models/more", "claim": "c"}],
            "shared_data[1].mount_path /models/more and shared_data[0].mount_path /models are "
            "inside one another",
        ),
        (
            [MODELS, {**MODELS, "name": "hf2", "mount_path": "/models2"}],
            "shared_data[1].kind: shared_data[0] is already the models cache",
        ),
        ([{**MODELS, "claim": ""}], "shared_data[0] needs one of claim"),
        (
            [{**MODELS, "nfs_server": "nfs.example.org", "nfs_path": "/x"}],
            "on Kubernetes, not both",
        ),
        (
            [{**MODELS, "claim": "", "nfs_server": "nfs.example.org"}],
            "shared_data[0] needs both nfs_server and nfs_path",
        ),
    ],
)
def test_entries_no_server_could_mount_are_refused_naming_the_key(entries, message):
    with pytest.raises(SettingsError) as refused:
        kube(*entries)
    assert message in str(refused.value)


def test_one_machine_needs_an_absolute_folder():
    with pytest.raises(SettingsError) as refused:
        local({"name": "hf", "mount_path": "/models", "folder": "models"})
    assert "shared_data[0].folder must name the folder (an absolute path)" in str(refused.value)
    [entry] = settings_from_mapping(
        {"data_dir": "/srv/gputap", "shared_data": [{**MODELS, "folder": "{data_dir}/models"}]},
        "test",
        environ={},
    ).shared_data
    assert entry["folder"] == "/srv/gputap/models"


def test_the_reserved_paths_hold_where_homes_and_disks_are():
    assert MOUNT_ROOT in RESERVED and f"/{HOME_FOLDER}" in RESERVED


# -- what servers get ------------------------------------------------------------------------


def test_pods_get_read_only_volumes_mounts_and_the_hugging_face_variables():
    entries = kube(
        MODELS,
        {
            "name": "imagenet",
            "mount_path": "/datasets/imagenet",
            "nfs_server": "10.0.0.5",
            "nfs_path": "/exports/{imagenet}",
        },
    ).shared_data
    settings = shared_data_pod_settings(entries, "/home/jovyan")
    listed = [
        {"name": "hf", "kind": "models", "path": "/models"},
        {"name": "imagenet", "kind": "datasets", "path": "/datasets/imagenet"},
    ]
    # braces doubled: KubeSpawner formats volumes and environment with the user's fields
    claim = {"claimName": "hf-models", "readOnly": True}
    assert settings == {
        "volumes": [
            {"name": "shared-hf", "persistentVolumeClaim": claim},
            {
                "name": "shared-imagenet",
                "nfs": {"server": "10.0.0.5", "path": "/exports/{{imagenet}}", "readOnly": True},
            },
        ],
        "volume_mounts": [
            {"name": "shared-hf", "mountPath": "/models", "readOnly": True},
            {"name": "shared-imagenet", "mountPath": "/datasets/imagenet", "readOnly": True},
        ],
        "environment": {
            "GPUTAP_SHARED_DATA": json.dumps(listed).replace("{", "{{").replace("}", "}}"),
            "HF_HUB_CACHE": "/models",
            "HF_HUB_OFFLINE": "1",
            "HF_HOME": "/home/jovyan/.cache/huggingface",
        },
    }  # fmt: skip


def test_without_a_models_entry_no_hugging_face_variable_is_set():
    entries = [{"name": "imagenet", "mount_path": "/data", "kind": "datasets"}]
    env = shared_data_env(entries, home="/h", seen_at=lambda e: e["mount_path"])
    assert set(env) == {"GPUTAP_SHARED_DATA"}
    assert shared_data_env([], home="/h", seen_at=lambda e: "") == {}


def test_the_chart_and_the_hub_add_to_what_kubespawner_already_mounts():
    c = Config()
    c.KubeSpawner.volumes = [{"name": "home", "persistentVolumeClaim": {"claimName": "x"}}]
    c.KubeSpawner.volume_mounts = [{"name": "home", "mountPath": "/home/jovyan"}]
    c.KubeSpawner.environment = {"A": "1"}
    configure_shared_data(c, kube(MODELS), "/home/jovyan")
    assert [v["name"] for v in c.KubeSpawner.volumes] == ["home", "shared-hf"]
    assert [m["name"] for m in c.KubeSpawner.volume_mounts] == ["home", "shared-hf"]
    assert c.KubeSpawner.environment["A"] == "1"
    assert c.KubeSpawner.environment["HF_HUB_OFFLINE"] == "1"


# -- one machine -----------------------------------------------------------------------------


@pytest.fixture
def open_tmp() -> Iterator[Path]:
    """A folder that every user may enter (pytest's own tmp_path is the hub user's alone)."""
    with tempfile.TemporaryDirectory(prefix="gputap-shared-") as name:
        Path(name).chmod(0o755)
        yield Path(name)


def shared_folder(parent: Path, mode: int = 0o755) -> Path:
    folder = parent / "models"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    folder.chmod(mode)
    return folder


def as_user(uid: int, work: Callable[[], Any]) -> Any:
    """``work()``'s result (JSON), run in a child process that is user ``uid`` alone, as a
    server's process is after it became its system user."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never back into pytest
        code = 1
        try:
            os.close(read_end)
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            os.write(write_end, json.dumps(work()).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as f:
        data = f.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    return json.loads(data)


def entry_for(folder: Path) -> dict:
    return {"name": "hf", "mount_path": "/models", "kind": "models", "folder": str(folder)}


def test_the_hub_does_not_start_with_a_missing_folder(tmp_path):
    settings = local(entry_for(tmp_path / "nowhere"))
    with pytest.raises(SettingsError) as refused:
        configure_shared_data(Config(), settings, "/home/jovyan")
    assert f"shared_data[0].folder {tmp_path / 'nowhere'} is not a folder" in str(refused.value)


def test_servers_of_their_own_accounts_need_a_folder_others_may_read(open_tmp):
    where = "shared_data[0]"
    folder = shared_folder(open_tmp, 0o750)
    problem = folder_problem(entry_for(folder), where, other_users=True)
    assert f"not readable by servers' users (mode 750): chmod o+rx {folder}" in problem
    assert folder_problem(entry_for(folder), where, other_users=False) is None  # the hub's
    # writable by anyone, someone else's, behind a closed folder: their view binds it
    # read-only (tests/unit/test_server_accounts.py), so none of that matters
    folder.chmod(0o777)
    os.chown(folder, NOBODY, -1)
    open_tmp.chmod(0o700)
    assert folder_problem(entry_for(folder), where, other_users=True) is None
    settings = local(entry_for(folder), run_as_system_user=True)
    c = Config()
    configure_shared_data(c, settings, "/home/jovyan")
    assert c.GPULocalSpawner.shared_data == settings.shared_data


@pytest.mark.skipif(os.geteuid() != 0, reason="becoming another user needs root")
def test_a_folder_that_passes_the_check_is_read_only_to_a_system_user(open_tmp):
    """A server as a system user (here: nobody) links the folder into its home as it starts,
    reads it there, and cannot write it."""
    folder = shared_folder(open_tmp)
    assert folder_problem(entry_for(folder), "shared_data[0]", other_users=True) is None
    home = open_tmp / "home"
    home.mkdir()
    os.chown(home, NOBODY, NOBODY)

    def server() -> dict:
        blocked = link_shared_data(home, [entry_for(folder)])
        seen = (home / "models" / "config.json").read_text()
        try:
            (home / "models" / "mine").write_text("x")
            wrote = "wrote"
        except OSError as e:
            wrote = errno.errorcode[e.errno]
        return {"blocked": blocked, "seen": seen, "wrote": wrote}

    assert as_user(NOBODY, server) == {"blocked": [], "seen": "{}", "wrote": "EACCES"}
    assert os.readlink(home / "models") == str(folder)
    assert sorted(p.name for p in folder.iterdir()) == ["config.json"]


def test_links_are_made_at_the_mount_path_in_the_home_and_a_users_file_is_kept(tmp_path):
    models, imagenet = tmp_path / "models", tmp_path / "imagenet"
    models.mkdir()
    imagenet.mkdir()
    home = tmp_path / "home"
    entries = [
        {"mount_path": "/models", "folder": str(models)},
        {"mount_path": "/datasets/imagenet", "folder": str(imagenet)},
    ]
    assert link_shared_data(home, entries) == []
    assert os.readlink(home / "models") == str(models)
    assert os.readlink(home / "datasets" / "imagenet") == str(imagenet)
    assert link_shared_data(home, entries) == []  # again: nothing to do

    other, elsewhere = tmp_path / "other-home", tmp_path / "elsewhere"
    elsewhere.mkdir()
    (other / "models").mkdir(parents=True)  # the user's own folder
    (other / "datasets").symlink_to(elsewhere)  # a link on the way is never followed
    assert link_shared_data(other, entries) == ["/models", "/datasets/imagenet"]
    assert not (other / "models").is_symlink() and list(elsewhere.iterdir()) == []


def test_servers_as_the_hubs_own_user_are_told_only_agreement_keeps_it_read_only(open_tmp, caplog):
    folder = shared_folder(open_tmp)
    settings = local(entry_for(folder), server_user="hub")
    with caplog.at_level("WARNING", logger="gputap.config"):
        configure_shared_data(Config(), settings, "/home/jovyan")
    assert "servers run as the hub's own user, who may write" in caplog.text
