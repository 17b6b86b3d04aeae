import re

import pytest

from billing_service.domain.pricing import (
    DEFAULT_DISK_PRICE_MICRO,
    check_price_class,
    make_price_book,
)
from gputap_common.settings import load_settings


@pytest.fixture
def book():
    return make_price_book(load_settings(environ={}).billing["prices"])


def test_cards_and_cpu_from_defaults(book):
    assert book.price("RTX-4090") == 5_000_000
    assert book.price("A100-40GB") == 6_666_667
    assert book.price("cpu") == 100_000


def test_slice_price_is_card_share_rounded_half_up(book):
    # 8.00 / 7 = 1.142857142... -> 1_142_857
    assert book.price("A100-80GB/1g.10gb") == 1_142_857
    # 8.00 * 3 / 7 = 3.428571428... -> 3_428_571
    assert book.price("A100-80GB/3g.40gb") == 3_428_571
    # 15.00 * 1 / 7 = 2.142857142... -> 2_142_857
    assert book.price("H200-141GB/1g.18gb") == 2_142_857
    # 12.00 * 2 / 7 = 3.4285714... ; 5.00 * 1 / 7 = 0.714285714 -> 714_286 (half up)
    assert book.price("RTX-4090/1g.5gb") == 714_286
    assert book.price("A100-80GB/7g.80gb") == 8_000_000


def test_explicit_slice_price_wins():
    book = make_price_book({"A100-80GB": "8.00", "A100-80GB/1g.10gb": "0.90"})
    assert book.price("A100-80GB/1g.10gb") == 900_000
    assert book.price("A100-80GB/2g.20gb") == 2_285_714


@pytest.mark.parametrize(
    "sku", ["B200", "A100-80GB/", "A100-80GB/8g.90gb", "A100-80GB/big", "cpu/1g.5gb", "X/1g.5gb"]
)
def test_unknown_sku_has_no_price(book, sku):
    assert book.price(sku) is None


def test_lookup_lists_unpriced(book):
    priced, unpriced = book.lookup(["T4", "B200", "T4/1g.5gb"])
    assert priced == {"T4": 1_500_000, "T4/1g.5gb": 214_286}
    assert unpriced == ["B200"]


def test_bad_price_names_the_key():
    with pytest.raises(ValueError, match="T4"):
        make_price_book({"T4": "cheap"})
    with pytest.raises(ValueError, match="slice"):
        make_price_book({"A100/huge": "1.00"})


def test_spot_costs_the_discounted_price():
    book = make_price_book({"A100-80GB": "8.00"}, spot_discount_percent=60)
    assert book.price("A100-80GB", "spot") == 3_200_000
    assert book.price("A100-80GB/1g.10gb", "spot") == (1_142_857 * 40 + 50) // 100
    assert book.price("A100-80GB") == 8_000_000


@pytest.mark.parametrize("bad", [-1, 100, 12.5, "60", True])
def test_bad_spot_discounts_are_refused(bad):
    with pytest.raises(ValueError, match="spot_discount_percent"):
        make_price_book({"T4": "1.50"}, spot_discount_percent=bad)


def test_a_shared_gpu_costs_a_share_of_the_card():
    book = make_price_book({"T4": "1.50"}, shared_percent=25)
    assert book.price("T4/shared") == 375_000
    assert book.price("T4/shared", "spot") == 150_000
    assert make_price_book({"T4": "1.50", "T4/shared": "0.50"}).price("T4/shared") == 500_000


def test_a_price_above_ten_thousand_per_hour_is_refused():
    assert make_price_book({"A100-80GB": "10000"}).price("A100-80GB") == 10_000_000_000
    with pytest.raises(ValueError, match=r"'A100-80GB'\] must be at most 10000.00 credits"):
        make_price_book({"A100-80GB": "10000.000001"})


def test_disks_cost_the_default_per_gb_hour_in_the_storage_class_only(book):
    # the settings name no disk price: 0.0002 credits per GB-hour
    assert DEFAULT_DISK_PRICE_MICRO == 200
    assert book.price("disk", "storage") == 200
    assert book.price("disk") is None and book.price("disk", "spot") is None
    assert book.price("T4", "storage") is None and book.price("cpu", "storage") is None
    assert book.skus("storage") == ["disk"]
    assert "disk" not in book.skus() and "T4" in book.skus("spot")
    # recorded in the book, so a stored version says what disks cost
    assert book.configured()["disk"] == 200


def test_a_configured_disk_price_and_disks_have_no_slices():
    book = make_price_book({"T4": "1.50", "disk": "0.0005"})
    assert book.price("disk", "storage") == 500
    assert book.lookup(["disk", "T4"], "storage") == ({"disk": 500}, ["T4"])
    with pytest.raises(ValueError, match="no slices"):
        make_price_book({"disk/1g.5gb": "0.10"})


@pytest.mark.parametrize(
    "sku, price_class, says",
    [
        ("T4", "storage", "'storage' is for data disks only (sku 'disk'"),
        ("disk", "on-demand", "send price_class 'storage', not 'on-demand'"),
        ("disk", "spot", "send price_class 'storage', not 'spot'"),
        ("T4", "cheap", "'on-demand', 'spot' or 'storage', not 'cheap'"),
    ],
)
def test_storage_is_for_disks_and_disks_are_storage(sku, price_class, says):
    with pytest.raises(ValueError, match=re.escape(says)):
        check_price_class(sku, price_class)
    check_price_class("disk", "storage")
    check_price_class("T4", "spot")
