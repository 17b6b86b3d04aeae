import re

import pytest

from billing_service.handlers.fields import SKU_NAME
from spawner.core.catalog import Card, Catalog, MigProfile, discovered_card, load_catalog

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
        (
            "A100-40GB",
            {"1g.5gb": 7, "1g.10gb": 4, "2g.10gb": 3, "3g.20gb": 2, "4g.20gb": 1, "7g.40gb": 1},
        ),
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
    """Known (shipped) profiles; the new cards' tables are in test_new_cards_mig_profiles."""
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


# -- real cards by the names drivers report (issue 13) ------------------------------------

#: (SKU, name as `nvidia-smi -L` prints it on current drivers, memory GB, dense FP16 TFLOPS)
REAL_NAMES = [
    ("H100-NVL", "NVIDIA H100 NVL", 94, 835.5),
    ("H100-80GB", "NVIDIA H100 80GB HBM3", 80, 989.4),
    ("H100-80GB", "NVIDIA H100 PCIe", 80, 989.4),
    ("H800-80GB", "NVIDIA H800 80GB HBM3", 80, 989.4),
    ("H800-80GB", "NVIDIA H800 PCIe", 80, 989.4),
    ("A800-80GB", "NVIDIA A800-SXM4-80GB", 80, 312),
    ("A800-80GB", "NVIDIA A800 80GB PCIe", 80, 312),
    ("A800-40GB", "NVIDIA A800 40GB Active", 40, 312),
    ("H20-96GB", "NVIDIA H20", 96, 148),
    ("GH200-96GB", "NVIDIA GH200 480GB", 96, 989.4),
    ("GH200-144GB", "NVIDIA GH200 144G HBM3e", 144, 989.4),
    ("L4", "NVIDIA L4", 24, 121),
    ("A10", "NVIDIA A10", 24, 125),
    ("A10G", "NVIDIA A10G", 24, 70),
    ("A30", "NVIDIA A30", 24, 165),
    ("RTX-6000-Ada", "NVIDIA RTX 6000 Ada Generation", 48, 364.2),
    ("RTX-A6000", "NVIDIA RTX A6000", 48, 154.8),
    ("RTX-5090", "NVIDIA GeForce RTX 5090", 32, 209.5),
    ("RTX-4090-D", "NVIDIA GeForce RTX 4090 D", 24, 147.1),
    ("RTX-3090-Ti", "NVIDIA GeForce RTX 3090 Ti", 24, 80),
    ("B200-180GB", "NVIDIA B200", 180, 2250),
    ("A100-80GB", "NVIDIA A100 80GB PCIe", 80, 312),
    ("A100-40GB", "NVIDIA A100-PCIE-40GB", 40, 312),
    ("H200-141GB", "NVIDIA H200 NVL", 141, 989.4),
    ("T4", "Tesla T4", 16, 65),
]


@pytest.mark.parametrize("sku,nvml_name,memory_gb,tflops", REAL_NAMES)
def test_real_cards_are_found_by_their_nvml_name_with_or_without_the_prefix(
    sku, nvml_name, memory_gb, tflops
):
    catalog = Catalog.load()
    bare = nvml_name.removeprefix("NVIDIA ")
    for name in (nvml_name, bare, nvml_name.replace(" ", "-"), bare.replace(" ", "-")):
        card = catalog.card_for_product(name)
        assert card is not None, f"{name!r} is not found"
        assert (card.sku, card.memory_gb, card.fp16_tflops) == (sku, memory_gb, tflops)
        assert card.known
    # the MIG device of such a card reports the card's name and its profile
    assert catalog.card_for_product(f"{nvml_name} MIG 1g.10gb").sku == sku


def test_first_product_of_every_shipped_card_is_the_nvml_name():
    catalog = Catalog.load()
    first = {sku: name for sku, name, _, _ in reversed(REAL_NAMES)}  # first listed wins
    for sku, name in first.items():
        if sku in ("H100-80GB", "H800-80GB", "A800-80GB", "A100-80GB", "A100-40GB", "H200-141GB"):
            continue  # several names; checked below
        assert catalog.card(sku).products[0] == name.replace(" ", "-")
    assert catalog.card("H800-80GB").products[:2] == ("NVIDIA-H800-80GB-HBM3", "NVIDIA-H800-PCIe")
    assert "NVIDIA-H800" not in catalog.card("H800-80GB").products  # no driver prints that


@pytest.mark.parametrize(
    "name,sku",
    [
        ("A100-SXM4-80GB", "A100-80GB"),
        ("A100-SXM4-40GB", "A100-40GB"),
        ("A100-PCIE-40GB", "A100-40GB"),
        ("A100-SXM4-40GB MIG 1g.5gb", "A100-40GB"),
        ("GeForce RTX 3090", "RTX-3090"),
        ("GeForce RTX 4090", "RTX-4090"),
        ("H200", "H200-141GB"),
        ("NVIDIA-A100-SXM4-80GB-MIG-1g.10gb", "A100-80GB"),
        ("  nvidia a100-sxm4-80gb  ", "A100-80GB"),
    ],
)
def test_names_from_older_drivers_and_gfd_labels_find_the_card(name, sku):
    assert Catalog.load().card_for_product(name).sku == sku


def test_names_that_only_look_alike_find_nothing():
    catalog = Catalog.load()
    for name in ("Quadro RTX 6000", "NVIDIA", "", "A100", "NVIDIA GeForce RTX 4090 Laptop GPU"):
        assert catalog.card_for_product(name) is None, name


H100_NVL = {"1g.12gb": 7, "1g.24gb": 4, "2g.24gb": 3, "3g.47gb": 2, "4g.47gb": 1, "7g.94gb": 1}
HOPPER_96 = {"1g.12gb": 7, "1g.24gb": 4, "2g.24gb": 3, "3g.48gb": 2, "4g.48gb": 1, "7g.96gb": 1}
A100_40 = {"1g.5gb": 7, "1g.10gb": 4, "2g.10gb": 3, "3g.20gb": 2, "4g.20gb": 1, "7g.40gb": 1}
A100_80 = {"1g.10gb": 7, "1g.20gb": 4, "2g.20gb": 3, "3g.40gb": 2, "4g.40gb": 1, "7g.80gb": 1}


@pytest.mark.parametrize(
    "sku,profiles",
    [
        ("H100-NVL", H100_NVL),
        ("GH200-96GB", HOPPER_96),
        ("H20-96GB", HOPPER_96),
        (
            "GH200-144GB",
            {"1g.18gb": 7, "1g.36gb": 4, "2g.36gb": 3, "3g.72gb": 2, "4g.72gb": 1, "7g.144gb": 1},
        ),
        (
            "B200-180GB",
            {"1g.23gb": 7, "1g.45gb": 4, "2g.45gb": 3, "3g.90gb": 2, "4g.90gb": 1, "7g.180gb": 1},
        ),
        ("A30", {"1g.6gb": 4, "2g.12gb": 2, "4g.24gb": 1}),
        ("A800-80GB", A100_80),
        ("A800-40GB", A100_40),
        ("H800-80GB", A100_80),
    ],
)
def test_new_cards_mig_profiles(sku, profiles):
    catalog = Catalog.load()
    assert {p.name: p.max_instances for p in catalog.card(sku).mig_profiles} == profiles
    for name in profiles:
        assert catalog.offering(f"{sku}/{name}").kind == "slice"


def test_slice_offerings_that_were_missing_exist():
    catalog = Catalog.load()
    assert catalog.offering("A100-40GB/1g.10gb").memory_gb == 10
    assert catalog.offering("H100-NVL/1g.12gb").fp16_tflops == round(835.5 / 7, 1)


def test_profiles_run_from_the_smallest_slice_to_the_whole_card():
    names = [p.name for p in Catalog.load().card("A100-40GB").mig_profiles]
    assert names == ["1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"]


def test_a30_slices_are_quarters_of_the_card():
    catalog = Catalog.load()
    assert catalog.card("A30").mig_slices == 4 and catalog.card("A100-80GB").mig_slices == 7
    assert catalog.offering("A30/1g.6gb").fp16_tflops == round(165 / 4, 1)
    assert catalog.offering("A30/4g.24gb").fp16_tflops == 165


def test_two_cards_claiming_one_product_are_refused():
    facts = {"memory_gb": 8, "fp16_tflops": 1, "products": ["Tesla T4"]}
    with pytest.raises(ValueError, match="Tesla T4.*both T4 and NEW|both NEW and T4"):
        Catalog.load({"cards": {"NEW": facts}})


# -- GPUs the catalog does not know -------------------------------------------------------


def test_discovered_card_is_what_nvml_says():
    card = discovered_card("NVIDIA RTX PRO 6000 Blackwell Server Edition", 97887)
    assert card == Card(
        sku="RTX-PRO-6000-Blackwell-Server-Edition",
        name="NVIDIA RTX PRO 6000 Blackwell Server Edition",
        memory_gb=95.6,
        fp16_tflops=0.0,
        products=("NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition",),
        known=False,
    )
    assert card.mig_profiles == ()


@pytest.mark.parametrize(
    "name,memory_mib,sku,memory_gb",
    [
        ("Quadro RTX 6000", 24576, "Quadro-RTX-6000", 24.0),
        ("NVIDIA TITAN V", 12066, "TITAN-V", 11.8),
        ("NVIDIA Graphics Device", 81559, "Graphics-Device", 79.6),
        ("NVIDIA  Foo/Bar (rev 2) ", 1024, "Foo-Bar-rev-2", 1.0),
        ("Tesla V100-SXM2-16GB", 16160, "Tesla-V100-SXM2-16GB", 15.8),
        # billing's SKU rule: letters, digits, '.', '-', at most 64
        ("NVIDIA A2_lite", 15360, "A2-lite", 15.0),
        ("NVIDIA " + "X" * 70, 1024, "X" * 64, 1.0),
    ],
)
def test_discovered_card_sku_and_memory(name, memory_mib, sku, memory_gb):
    card = discovered_card(name, memory_mib)
    assert SKU_NAME.fullmatch(card.sku), "billing must accept a price for it"
    assert (card.sku, card.memory_gb, card.name) == (sku, memory_gb, name.strip())
    assert card.products == (re.sub(r"\s+", "-", name.strip()),)
    assert not card.known and card.fp16_tflops == 0.0 and card.mig_profiles == ()


@pytest.mark.parametrize(
    "name,memory_mib,message",
    [
        ("", 1024, "no name"),
        ("NVIDIA ", 1024, "no name"),
        ("NVIDIA ()", 1024, "letters or digits"),
        ("cpu", 1024, "reserved"),
        ("NVIDIA disk", 1024, "reserved"),
        ("NVIDIA X", 0, "memory"),
        ("NVIDIA X", -5, "memory"),
        ("NVIDIA X", True, "memory"),
        ("NVIDIA X", 1.5, "memory"),
        (None, 1024, "no name"),
    ],
)
def test_discovered_card_refuses_what_cannot_be_a_card(name, memory_mib, message):
    with pytest.raises(ValueError, match=message):
        discovered_card(name, memory_mib)


def test_with_cards_adds_discovered_cards_and_finds_them_by_name():
    base = Catalog.load()
    pro = discovered_card("NVIDIA RTX PRO 6000 Blackwell Server Edition", 97887)
    catalog = base.with_cards([pro])
    assert catalog is not base and "RTX-PRO-6000-Blackwell-Server-Edition" not in base.cards
    assert catalog.card_for_product("NVIDIA RTX PRO 6000 Blackwell Server Edition") == pro
    assert catalog.card_for_product("RTX PRO 6000 Blackwell Server Edition") == pro
    offering = catalog.offering(pro.sku)
    assert (offering.kind, offering.memory_gb, offering.known) == ("card", 95.6, False)
    assert not any(o.kind == "slice" and o.card == pro.sku for o in catalog.offerings())
    assert catalog.cpu == base.cpu
    assert set(base.cards) < set(catalog.cards)


def test_with_cards_keeps_a_card_the_catalog_has_by_sku():
    base = Catalog.load()
    stranger = discovered_card("NVIDIA L4", 23034)  # sku L4, as if NVML named it so
    catalog = base.with_cards([stranger, discovered_card("NVIDIA L4", 1)])
    assert catalog.card("L4") == base.card("L4") and catalog.card("L4").known


def test_operator_facts_make_an_unknown_card_known():
    name = "NVIDIA RTX PRO 6000 Blackwell Server Edition"
    facts = {
        "name": name,
        "memory_gb": 96,
        "fp16_tflops": 503.8,
        "products": [name.replace(" ", "-")],
    }
    catalog = Catalog.load({"cards": {"RTX-PRO-6000": facts}})
    card = catalog.card_for_product(name)
    assert (card.sku, card.known, card.fp16_tflops) == ("RTX-PRO-6000", True, 503.8)
    # the inventory finds it by name, so it never discovers it; were it to, the facts stay
    found = catalog.with_cards([discovered_card(name, 97887)])
    assert found.card_for_product(name).known


def test_load_catalog_is_built_once_per_configuration():
    assert load_catalog({}) is load_catalog({})
    edited = load_catalog({"T4": {"fp16_tflops": 60}})
    assert edited is not load_catalog({}) and edited.card("T4").fp16_tflops == 60


def _doc_row(card: Card) -> str:
    """The row docs/catalog.md holds for a shipped card."""
    names = ", ".join(f"`{p}`" for p in card.products)
    profiles = ", ".join(f"{p.name} ×{p.max_instances}" for p in card.mig_profiles) or "—"
    return f"| {card.sku} | {names} | {card.memory_gb:g} | {card.fp16_tflops:g} | {profiles} |"


def test_the_docs_table_lists_every_shipped_card_as_the_catalog_has_it():
    from pathlib import Path

    doc = (Path(__file__).parents[2] / "docs" / "catalog.md").read_text()
    missing = [_doc_row(c) for c in Catalog.load().cards.values() if _doc_row(c) not in doc]
    assert not missing, "docs/catalog.md lacks or differs in:\n" + "\n".join(missing)
