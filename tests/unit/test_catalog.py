import pytest

from spawner.core.catalog import Catalog, MigProfile

REQUIRED = [
    "A100-40GB", "A100-80GB", "H100-80GB", "H200-141GB", "H800-80GB", "L40S", "L40", "A40",
    "RTX-4090", "RTX-3090", "T4",
]  # fmt: skip


def test_shipped_catalog_has_every_required_card_with_facts():
    catalog = Catalog.load()
    for sku in REQUIRED:
        card = catalog.card(sku)
        assert card.memory_gb > 0 and card.fp16_tflops > 0 and card.products
    assert catalog.offering("cpu").kind == "cpu"


@pytest.mark.parametrize(
    "sku,profiles",
    [
        ("A100-40GB", {"1g.5gb": 7, "2g.10gb": 3, "3g.20gb": 2, "4g.20gb": 1, "7g.40gb": 1}),
        (
            "A100-80GB",
            {"1g.10gb": 7, "1g.20gb": 4, "2g.20gb": 3, "3g.40gb": 2, "4g.40gb": 1, "7g.80gb": 1},
        ),
        (
            "H100-80GB",
            {"1g.10gb": 7, "1g.20gb": 4, "2g.20gb": 3, "3g.40gb": 2, "4g.40gb": 1, "7g.80gb": 1},
        ),
        (
            "H800-80GB",
            {"1g.10gb": 7, "1g.20gb": 4, "2g.20gb": 3, "3g.40gb": 2, "4g.40gb": 1, "7g.80gb": 1},
        ),
        (
            "H200-141GB",
            {"1g.18gb": 7, "1g.35gb": 4, "2g.35gb": 3, "3g.71gb": 2, "4g.71gb": 1, "7g.141gb": 1},
        ),
    ],
)
def test_mig_profiles_match_nvidia_tables(sku, profiles):
    card = Catalog.load().card(sku)
    assert {p.name: p.max_instances for p in card.mig_profiles} == profiles


def test_cards_without_mig_have_no_slices():
    catalog = Catalog.load()
    assert not any(o.card == "RTX-4090" and o.kind == "slice" for o in catalog.offerings())


def test_slice_offering_has_share_of_compute_and_its_memory():
    o = Catalog.load().offering("A100-80GB/3g.40gb")
    assert (o.kind, o.memory_gb, o.fp16_tflops) == ("slice", 40, round(312 * 3 / 7, 1))
    assert o.label == "A100-80GB 3g.40gb slice"


def test_operator_adds_and_edits_cards_without_code():
    catalog = Catalog.load(
        {
            "cards": {
                "RTX-5090": {
                    "memory_gb": 32,
                    "fp16_tflops": 209.5,
                    "products": ["NVIDIA-GeForce-RTX-5090"],
                },
                "T4": {"fp16_tflops": 60},
            }
        }
    )
    assert catalog.card("RTX-5090").memory_gb == 32
    assert catalog.card("T4").fp16_tflops == 60
    assert catalog.card("T4").memory_gb == 16  # untouched keys stay


@pytest.mark.parametrize(
    "facts,message",
    [
        ({"memory_gb": -1, "fp16_tflops": 1, "products": ["x"]}, "memory_gb must be a positive"),
        ({"memory_gb": 8, "fp16_tflops": "fast", "products": ["x"]}, "fp16_tflops"),
        ({"memory_gb": 8, "fp16_tflops": 1}, "products"),
        (
            {"memory_gb": 8, "fp16_tflops": 1, "products": ["x"], "mig_profiles": {"big": 1}},
            "not of the form",
        ),
    ],
)
def test_bad_card_facts_are_refused_with_the_key(facts, message):
    with pytest.raises(ValueError, match=message):
        Catalog.load({"cards": {"NEW": facts}})


def test_product_labels_and_nvml_names_find_the_card():
    catalog = Catalog.load()
    assert catalog.card_for_product("NVIDIA-A100-SXM4-80GB").sku == "A100-80GB"
    assert catalog.card_for_product("NVIDIA A100-SXM4-80GB").sku == "A100-80GB"
    assert catalog.card_for_product("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb").sku == "A100-40GB"
    assert catalog.card_for_product("NVIDIA GeForce RTX 4090").sku == "RTX-4090"
    assert catalog.card_for_product("Tesla T4").sku == "T4"
    assert catalog.card_for_product("NVIDIA H200").sku == "H200-141GB"
    assert catalog.card_for_product("Matrox G200") is None


def test_mig_profile_parse_rejects_bad_counts():
    with pytest.raises(ValueError, match="max instances"):
        MigProfile.parse("1g.10gb", 8)
