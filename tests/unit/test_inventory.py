import pytest

from spawner.core.catalog import Catalog
from spawner.core.placement import CardRequest, SliceRequest, place
from spawner.local.inventory import DevicePool, file_devices, load_local_devices
from spawner.local.spawner import DEFAULT_INVENTORY_FILE

CATALOG = Catalog.load()


def test_shipped_simulated_inventory_has_a_mig_partitioned_card():
    devices = file_devices(DEFAULT_INVENTORY_FILE, CATALOG)
    keys = [d.key for d in devices]
    assert keys.count("A100-80GB/1g.10gb") == 3
    assert keys.count("A100-80GB/2g.20gb") == 2
    assert all(d.simulated for d in devices)
    assert all(d.uuid.startswith("MIG-") for d in devices if d.profile)
    assert len({d.uuid for d in devices}) == len(devices)
    # UUIDs are stable across reads (servers re-attach to the same devices)
    assert [d.uuid for d in file_devices(DEFAULT_INVENTORY_FILE, CATALOG)] == [
        d.uuid for d in devices
    ]


def test_auto_falls_back_to_the_file_without_nvml():
    devices = load_local_devices("auto", DEFAULT_INVENTORY_FILE, CATALOG)
    assert devices and all(d.simulated for d in devices)


@pytest.mark.parametrize(
    "gpus,message",
    [
        ("- card: A100-80GB\n  mig: [7g.80gb, 1g.10gb]", "need 8 of 7"),
        ("- card: A100-80GB\n  mig: [1g.5gb]", "no MIG profile 1g.5gb"),
        ("- card: A100-80GB\n  mig: [3g.40gb, 3g.40gb, 3g.40gb]", "at most 2"),
        ("- card: GTX-1080", "unknown card"),
    ],
)
def test_impossible_simulated_layouts_are_refused(tmp_path, gpus, message):
    path = tmp_path / "inv.yaml"
    path.write_text("gpus:\n" + gpus + "\n")
    with pytest.raises(ValueError, match=message):
        file_devices(path, CATALOG)


def pool():
    return DevicePool(file_devices(DEFAULT_INVENTORY_FILE, CATALOG), "ws")


PRICES = {"A100-80GB/1g.10gb": 1, "RTX-4090": 5, "A100-80GB": 8}


def test_pool_gives_each_holder_different_devices_and_frees_them():
    p = pool()
    taken = []
    for holder in ["a", "b", "c"]:
        answer = place(SliceRequest("A100-80GB", "1g.10gb"), p.free_view(), CATALOG, PRICES)
        taken += [d.uuid for d in p.take(answer, holder)]
    assert len(set(taken)) == 3
    assert p.free_view().free("A100-80GB/1g.10gb") == 0
    assert p.release("b") == [taken[1]]
    assert p.free_view().free("A100-80GB/1g.10gb") == 1


def test_claims_after_restart_keep_devices_taken():
    p = pool()
    answer = place(CardRequest("RTX-4090", 2), p.free_view(), CATALOG, PRICES)
    uuids = [d.uuid for d in p.take(answer, "alice")]
    restarted = pool()
    assert restarted.claim(uuids, "alice") == []
    assert restarted.free_view().free("RTX-4090") == 0
    # someone else's claim on a held device, or an unknown device, is reported
    assert restarted.claim(uuids[:1] + ["GPU-gone"], "bob") == [uuids[0], "GPU-gone"]


def test_a_holders_own_devices_count_as_free_for_its_change():
    p = pool()
    answer = place(CardRequest("RTX-4090", 2), p.free_view(), CATALOG, PRICES)
    p.take(answer, "alice")
    assert p.free_view().free("RTX-4090") == 0
    # alice could move to both cards again (or to one), bob could not
    assert p.free_view(as_free="alice").max_free("RTX-4090") == 2
    assert p.free_view(as_free="bob").free("RTX-4090") == 0
    assert p.free_view(as_free="alice").total("RTX-4090") == 2
