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
UNKNOWN_UUID = "GPU-00000000-0000-0000-0000-000000000001"
UNKNOWN = f"NVIDIA RTX PRO 6000 Blackwell Server Edition|{UNKNOWN_UUID}|97887|none"
UNKNOWN_SKU = "RTX-PRO-6000-Blackwell-Server-Edition"

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


def test_a_gpu_the_catalog_does_not_know_is_offered_as_nvml_names_it(read_inventory):
    reading = read_inventory("nvml_devices", devices=f"{UNKNOWN};{H200}")
    assert reading.error is None, reading.message
    assert [(d.uuid, d.card, d.gpu_index, d.memory_mib, d.known) for d in reading.devices] == [
        (UNKNOWN_UUID, UNKNOWN_SKU, 0, 97887, False),
        (H200_UUID, "H200-141GB", 1, 143771, True),
    ]
    assert reading.devices[0].product == "NVIDIA RTX PRO 6000 Blackwell Server Edition"
    assert (
        f"GPU 0 ({UNKNOWN_UUID}): NVIDIA RTX PRO 6000 Blackwell Server Edition is not in the "
        f"catalog: offered as {UNKNOWN_SKU}"
    ) in reading.log
    assert f"unpriced until billing.prices prices {UNKNOWN_SKU}" in reading.log


def test_a_gpu_nvml_cannot_reach_is_skipped_and_the_others_are_listed(read_inventory):
    lost = "NVIDIA A100-SXM4-80GB|GPU-00000000-0000-0000-0000-000000000002|81920|lost"
    reading = read_inventory("auto", devices=f"{lost};{H200}")
    assert reading.error is None, reading.message
    assert [(d.uuid, d.gpu_index, d.simulated) for d in reading.devices] == [(H200_UUID, 1, False)]
    assert "GPU 0: GPU is lost; left out, the other GPUs are served" in reading.log


def test_only_unknown_gpus_are_served_as_they_are_never_replaced_by_simulated_cards(
    read_inventory,
):
    for mode in ("nvml", "auto"):
        reading = read_inventory(mode, devices=UNKNOWN)
        assert reading.error is None, reading.message
        assert [(d.uuid, d.card, d.simulated) for d in reading.devices] == [
            (UNKNOWN_UUID, UNKNOWN_SKU, False)
        ]
        assert "simulated" not in reading.log


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
        assert "INFO NVML found no GPU; using simulated inventory" in reading.log


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
    reading = read_inventory("auto", devices=f"{H200};{A100_MIG};{UNKNOWN}")
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


# -- real machines: failing devices, old drivers, pending MIG modes, GPUs kept out ----------

H200_B_UUID = "GPU-2b3c4d5e-6f70-4182-93a4-b5c6d7e8f901"
H200_B = f"NVIDIA H200|{H200_B_UUID}|143771|off"


def test_a_gpu_failing_any_later_call_is_left_out_and_the_rest_served(read_inventory):
    for call, code in (
        ("nvmlDeviceGetName", "UNKNOWN"),
        ("nvmlDeviceGetMemoryInfo", "GPU_IS_LOST"),
        ("nvmlDeviceGetMigMode", "NO_PERMISSION"),
        ("nvmlDeviceGetUUID", "GPU_IS_LOST"),
    ):
        reading = read_inventory(
            "auto", devices=f"{H200};{H200_B}", fail_calls=f"{call}@{H200_UUID}={code}"
        )
        assert reading.error is None, (call, reading.message)
        assert [(d.uuid, d.gpu_index, d.simulated) for d in reading.devices] == [
            (H200_B_UUID, 1, False)
        ], call
        assert "GPU 0" in reading.log and "left out, the other GPUs are served" in reading.log


def test_a_failing_mig_device_leaves_out_its_gpu_not_the_machine(read_inventory):
    reading = read_inventory(
        "nvml_devices",
        devices=f"{H200};{A100_MIG}",
        fail_calls=f"nvmlDeviceGetMemoryInfo@{MIG_1G_B_UUID}=UNKNOWN",
    )
    assert reading.error is None, reading.message
    assert [d.uuid for d in reading.devices] == [H200_UUID]
    assert f"GPU 1 ({A100_UUID}): Unknown Error; left out" in reading.log


def test_every_gpu_failing_gives_no_gpu_and_no_simulated_cards(read_inventory):
    reading = read_inventory("auto", devices=H200, fail_calls=f"*@{H200_UUID}=GPU_IS_LOST")
    assert reading.error is None, reading.message
    assert reading.devices == []
    assert "NVML found 1 GPU(s) but none gputap can serve" in reading.log


def test_an_old_driver_without_the_v3_call_and_its_names_and_mig_uuids(
    read_inventory, fake_nvml_old_dir
):
    reading = read_inventory(
        "nvml_devices", devices=f"{H200};{A100_MIG}", library=fake_nvml_old_dir
    )
    assert reading.error is None, reading.message
    assert [(d.uuid, d.key) for d in reading.devices] == [
        (H200_UUID, "H200-141GB"),
        # R460 names MIG devices MIG-GPU-<parent>/<GPU instance>/<compute instance>
        (f"MIG-{A100_UUID}/1/0", "A100-80GB/3g.40gb"),
        (f"MIG-{A100_UUID}/7/0", "A100-80GB/1g.10gb"),
        (f"MIG-{A100_UUID}/8/0", "A100-80GB/1g.10gb"),
    ]
    # the busy check lists processes through _v2 there
    busy = read_inventory(
        "nvml_busy",
        devices=H200,
        use=f"{H200_UUID}|0|2000|2",
        library=fake_nvml_old_dir,
        exclude=[H200_UUID],
    )
    assert busy.error is None, busy.message
    assert busy.busy == {H200_UUID: [4000, 4001]}


def test_a_pending_mig_mode_is_reported_and_the_current_one_served(read_inventory):
    a100_going_off = A100_MIG.replace("|81920|on;", "|81920|on>off;")
    reading = read_inventory("nvml_devices", devices=f"{H200};{a100_going_off}")
    assert reading.error is None, reading.message
    assert [d.profile for d in reading.devices if d.gpu_index == 1] == [
        "3g.40gb",
        "1g.10gb",
        "1g.10gb",
    ]
    assert f"GPU 1 ({A100_UUID}): MIG mode on now, off after the next GPU reset" in reading.log
    # MIG about to be switched on: still a whole GPU until the reset
    h200_going_on = H200.replace("|off", "|off>on")
    reading = read_inventory("nvml_devices", devices=h200_going_on)
    assert [(d.uuid, d.profile) for d in reading.devices] == [(H200_UUID, None)]
    assert "MIG mode off now, on after the next GPU reset" in reading.log


def test_chosen_gpus_are_kept_out_by_index_or_uuid(read_inventory):
    machine = f"{H200};{A100_MIG};{H200_B}"
    reading = read_inventory("nvml_devices", devices=machine, exclude=["0", MIG_1G_A_UUID])
    assert reading.error is None, reading.message
    assert [d.uuid for d in reading.devices] == [MIG_3G_UUID, MIG_1G_B_UUID, H200_B_UUID]
    assert f"GPU 0 ({H200_UUID}) kept out of gputap by spawner.exclude_gpus" in reading.log

    reading = read_inventory("auto", devices=machine, exclude=[A100_UUID, "7", "GPU-nothere"])
    assert [d.uuid for d in reading.devices] == [H200_UUID, H200_B_UUID]
    assert "spawner.exclude_gpus: 7 is no GPU or MIG device here" in reading.log
    assert "spawner.exclude_gpus: GPU-nothere is no GPU or MIG device here" in reading.log
    assert not any(d.simulated for d in reading.devices)
