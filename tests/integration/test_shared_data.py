"""Shared data on one machine, through the real hub: a models folder linked into every home
at its mount path, listed by the server's contents API, and the Hugging Face variables set.
Servers here run as accounts of their own (the default for a hub running as root), whose
view holds the folder read-only: tests/integration/test_server_accounts.py tries to write it;
servers as the hub's own user are told in the hub's log that agreement alone keeps it
read-only (tests/unit/test_shared_data.py)."""

import json
from pathlib import Path

import pytest
import requests

from tests.platform import Platform

CPU = {"kind": "cpu"}
MODEL_FILE = "models--acme--tiny/snapshots/abc123/config.json"


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("hf-cache")
    (folder / MODEL_FILE).parent.mkdir(parents=True)
    (folder / MODEL_FILE).write_text('{"model_type": "tiny"}')
    folder.chmod(0o755)  # servers' accounts read it
    return folder


@pytest.fixture(scope="module")
def platform(tmp_path_factory, models):
    shared = [{"name": "hf", "mount_path": "/models", "kind": "models", "folder": str(models)}]
    p = Platform(tmp_path_factory.mktemp("shared-data"), extra={"shared_data": shared})
    p.start()
    yield p
    p.shutdown()


def test_the_models_folder_is_seen_in_the_home_with_the_hugging_face_variables(platform, models):
    platform.create_user("hana")
    assert platform.spawn("hana", CPU).status_code in (201, 202)
    platform.wait_ready("hana")
    env = platform.server_env("hana")
    home = Path(env["HOME"])
    assert env["HF_HUB_CACHE"] == str(models)
    assert env["HF_HUB_OFFLINE"] == "1"
    assert env["HF_HOME"] == str(home / ".cache" / "huggingface")
    assert json.loads(env["GPUTAP_SHARED_DATA"]) == [
        {"name": "hf", "kind": "models", "path": str(home / "models")}
    ]

    token = platform.user_token("hana")
    contents = f"{platform.url}/user/hana/api/contents"
    auth = {"Authorization": f"token {token}"}
    r = requests.get(f"{contents}/", headers=auth, timeout=30)
    assert r.status_code == 200, r.text
    assert "models" in {item["name"] for item in r.json()["content"]}
    r = requests.get(f"{contents}/models/{MODEL_FILE}", headers=auth, timeout=30)
    assert r.status_code == 200, r.text
    assert json.loads(r.json()["content"]) == {"model_type": "tiny"}
    assert (home / "models").is_symlink()

    platform.stop_server("hana")
