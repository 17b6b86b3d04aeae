"""The inventory read through pynvml from a fake libnvidia-ml.so.1 (see fake_nvml.c)."""

from spawner.core.catalog import Catalog
from spawner.core.placement import CardRequest, Placement, SliceRequest, place
from spawner.local.inventory import DevicePool, file_devices
from spawner.local.spawner import DEFAULT_INVENTORY_FILE

H200_UUID = "GPU-9d5e1c2a-6f0b-4b8e-a3c7-1e2f3a4b5c6d"
A100_UUID = "GPU-4a1c7e90-2d3b-4c5d-8e9f-0a1b2c3d4e5f"
MIG_3G_UUID = "MIG-77b0f1e2-3c4d-5e6f-7a8b-9c0d1e2f3a4b"
MIG_1G_A_UUID = "MIG-0c2e4f60-8a1b-5c3d-9e7f-1a2b3c4d5e6f"
MIG_1G_B_UUID = "MIG-5d6e7f80-9a0b-5c1d-8e2f-3a4b5c6d7e8f"

H200 = f"NVIDIA H200|{H200_UUID}|143771|off"
# MIG on with slots 1, 2, 4, 6 empty, as after destroying some instances.
A100_MIG = f"""
    NVIDIA A100-SXM4-80GB|{A100_UUID}|81920|on;
    @0|NVIDIA A100-SXM4-80GB MIG 3g.40gb|{MIG_3G_UUID}|40192;
    @3|NVIDIA A100-SXM4-80GB MIG 1g.10gb|{MIG_1G_A_UUID}|9984;
    @5|NVIDIA A100-SXM4-80GB MIG 1g.10gb|{MIG_1G_B_UUID}|9984
"""
MATROX = "Matrox G200|GPU-00000000-0000-0000-0000-000000000001|16|none"

PRICES = {"H200-141GB": 9_000_000, "A100-80GB/1g.10gb": 900_000, "A100-80GB/3g.40gb": 3_000_000}


def test_whole_gpus_come_with_their_uuid_card_and_memory(read_inventory):
    reading = read_inventory("nvml_devices", devices=H200)
    assert reading.error is None, reading.message
    [h200] = reading.devices
    assert (h200.uuid, h200.card, h200.profile, h200.key) == (
        H200_UUID,
        "H200-141GB",
        None,
        "H200-141GB",
    )
    assert (h200.gpu_index, h200.memory_mib, h200.simulated) == (0, 143771, False)


def test_a_mig_enabled_card_lists_its_mig_devices_not_itself(read_inventory):
    reading = read_inventory("nvml_devices", devices=f"{H200};{A100_MIG}")
    assert reading.error is None, reading.message
    migs = [d for d in reading.devices if d.gpu_index == 1]
    assert [(d.uuid, d.profile, d.key, d.memory_mib) for d in migs] == [
        (MIG_3G_UUID, "3g.40gb", "A100-80GB/3g.40gb", 40192),
        (MIG_1G_A_UUID, "1g.10gb", "A100-80GB/1g.10gb", 9984),
        (MIG_1G_B_UUID, "1g.10gb", "A100-80GB/1g.10gb", 9984),
    ]
    assert A100_UUID not in {d.uuid for d in reading.devices}
    assert not any(d.simulated for d in reading.devices)


def test_a_card_the_catalog_does_not_know_is_skipped_with_a_warning(read_inventory):
    reading = read_inventory("nvml_devices", devices=f"{MATROX};{H200}")
    assert reading.error is None, reading.message
    assert [(d.uuid, d.gpu_index) for d in reading.devices] == [(H200_UUID, 1)]
    assert "GPU 0 (Matrox G200) is not in the catalog" in reading.log


def test_a_gpu_nvml_cannot_reach_is_skipped_and_the_others_are_listed(read_inventory):
    lost = "NVIDIA A100-SXM4-80GB|GPU-00000000-0000-0000-0000-000000000002|81920|lost"
    reading = read_inventory("auto", devices=f"{lost};{H200}")
    assert reading.error is None, reading.message
    assert [(d.uuid, d.gpu_index, d.simulated) for d in reading.devices] == [(H200_UUID, 1, False)]
    assert "GPU 0: GPU is lost; skipped" in reading.log


def test_only_unknown_cards_means_no_nvml_inventory(read_inventory):
    reading = read_inventory("nvml", devices=MATROX)
    assert reading.error == "InventoryUnavailable"
    assert "no GPU that the catalog knows" in reading.message


def simulated_uuids() -> list[str]:
    return [d.uuid for d in file_devices(DEFAULT_INVENTORY_FILE, Catalog.load())]


def test_auto_uses_the_simulated_file_when_the_driver_is_not_loaded(read_inventory):
    reading = read_inventory("auto", devices=H200, fail="driver")
    assert reading.error is None, reading.message
    assert [d.uuid for d in reading.devices] == simulated_uuids()
    assert all(d.simulated for d in reading.devices)
    assert "Driver Not Loaded; using simulated inventory" in reading.log


def test_auto_uses_the_simulated_file_when_nvml_sees_no_gpu(read_inventory):
    for devices in (None, ""):
        reading = read_inventory("auto", devices=devices)
        assert reading.error is None, reading.message
        assert [d.uuid for d in reading.devices] == simulated_uuids()
        assert "NVML found no GPU that the catalog knows; using simulated" in reading.log


def test_nvml_mode_refuses_without_a_driver_and_says_why(read_inventory):
    reading = read_inventory("nvml", devices=H200, fail="driver")
    assert (reading.error, reading.message) == (
        "InventoryUnavailable",
        "NVML unavailable: Driver Not Loaded",
    )


def test_nvml_mode_refuses_when_nvml_sees_no_gpu(read_inventory):
    reading = read_inventory("nvml", devices="")
    assert reading.error == "InventoryUnavailable"
    assert "NVML found no GPU" in reading.message


def test_a_pool_from_nvml_hands_out_the_real_uuids(read_inventory):
    catalog = Catalog.load()
    reading = read_inventory("auto", devices=f"{H200};{A100_MIG};{MATROX}")
    assert reading.error is None, reading.message
    pool = DevicePool(reading.devices, "gpu-node-1")
    assert not pool.simulated

    def take(request, holder):
        answer = place(request, pool.free_view(), catalog, PRICES)
        assert isinstance(answer, Placement), answer.message
        assert answer.node == "gpu-node-1"
        return [d.uuid for d in pool.take(answer, holder)]

    first = take(SliceRequest("A100-80GB", "1g.10gb"), "alice/default")
    second = take(SliceRequest("A100-80GB", "1g.10gb"), "bob/default")
    card = take(CardRequest("H200-141GB"), "carol/default")

    assert {*first, *second} == {MIG_1G_A_UUID, MIG_1G_B_UUID}
    assert card == [H200_UUID]
    # Both 1g.10gb devices are taken now; the 3g.40gb one is still offered instead.
    refusal = place(SliceRequest("A100-80GB", "1g.10gb"), pool.free_view(), catalog, PRICES)
    assert not isinstance(refusal, Placement)
    assert "3g.40gb" in refusal.message
    assert pool.release("alice/default") == first
