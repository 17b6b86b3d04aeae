"""A GPU the catalog does not know, offered as what NVML says: how placement, the choices
and the spawn form treat it (its TFLOPS are unknown; it is unpriced until an operator
prices it)."""

import pytest

from billing_service.domain.pricing import make_price_book
from gputap_common.settings import load_settings
from spawner.core.asking import Credit
from spawner.core.catalog import Catalog, discovered_card
from spawner.core.choices import build_choices
from spawner.core.form import render_form
from spawner.core.placement import (
    CardRequest,
    FreeView,
    Placement,
    RequestError,
    SpecRequest,
    place,
)

PRO_NAME = "NVIDIA RTX PRO 6000 Blackwell Server Edition"
PRO = discovered_card(PRO_NAME, 97887)  # 95.6 GB
CATALOG = Catalog.load().with_cards([PRO])
TEN = Credit(10_000_000, 0, 10_000_000, 10_000_000, min_billable_seconds=60)


def view(**free: int) -> FreeView:
    """One machine, "box", with ``free`` units of each key free (and at least one in all)."""
    v = FreeView()
    for key, n in free.items():
        v.set(key, "box", n, max(n, 1))
    return v


def test_a_spec_with_a_tflops_minimum_never_gets_a_card_of_unknown_speed():
    prices = {PRO.sku: 9_000_000}
    with pytest.raises(RequestError, match="no machine here has"):
        place(SpecRequest(min_memory_gb=16, min_tflops=1), view(**{PRO.sku: 1}), CATALOG, prices)


def test_a_memory_only_spec_may_get_a_card_of_unknown_speed():
    prices = {PRO.sku: 9_000_000}
    answer = place(SpecRequest(min_memory_gb=90), view(**{PRO.sku: 1}), CATALOG, prices)
    assert isinstance(answer, Placement) and answer.offering.key == PRO.sku


def test_at_one_price_a_spec_prefers_the_card_whose_speed_is_known():
    prices = {PRO.sku: 9_000_000, "H100-NVL": 9_000_000}
    answer = place(
        SpecRequest(min_memory_gb=90), view(**{PRO.sku: 1, "H100-NVL": 1}), CATALOG, prices
    )
    assert answer.offering.key == "H100-NVL"


def test_an_unpriced_unknown_card_is_skipped_by_a_spec_and_refused_by_name():
    prices = {"L4": 2_000_000}
    answer = place(SpecRequest(min_memory_gb=16), view(**{PRO.sku: 1, "L4": 1}), CATALOG, prices)
    assert answer.offering.key == "L4"
    with pytest.raises(RequestError, match="no price; ask an operator"):
        place(CardRequest(PRO.sku), view(**{PRO.sku: 1}), CATALOG, prices)


def test_the_form_shows_an_unknown_card_with_its_memory_and_tflops_unknown_unpriced_off():
    choices = build_choices(view(**{PRO.sku: 1, "L4": 1}), CATALOG, {"L4": 2_000_000, "cpu": 1})
    html = render_form(choices, credit=TEN, simulated=False, preview_url="/p")
    row = html.split(f'data-key="{PRO.sku}"')[1].split("</div>")[0]
    assert "95.6 GB · TFLOPS unknown" in row and "0 FP16 TFLOPS" not in row
    assert "no price set" in row
    assert f'value="card:{PRO.sku}" disabled' in row
    assert "121 FP16 TFLOPS" in html  # a known card keeps its figure


def test_a_priced_unknown_card_can_be_picked():
    choices = build_choices(view(**{PRO.sku: 1}), CATALOG, {PRO.sku: 9_000_000, "cpu": 1})
    html = render_form(choices, credit=TEN, simulated=False, preview_url="/p")
    row = html.split(f'data-key="{PRO.sku}"')[1].split("</div>")[0]
    assert "TFLOPS unknown" in row and "9.00/h" in row
    assert f'value="card:{PRO.sku}" checked' in row


def test_settings_accept_a_price_for_a_discovered_sku(tmp_path):
    f = tmp_path / "gputap.yaml"
    f.write_text(f"billing:\n  prices:\n    {PRO.sku}: '9.00'\n")
    prices = load_settings(f, environ={}).billing["prices"]
    assert prices[PRO.sku] == "9.00" and "A100-80GB" in prices  # merged over the defaults
    assert make_price_book(prices).price(PRO.sku) == 9_000_000


def test_a_shared_share_of_an_unknown_card_says_its_speed_is_unknown_too():
    shared = f"{PRO.sku}/shared"
    choices = build_choices(view(**{shared: 4}), CATALOG, {shared: 2_000_000, "cpu": 1})
    html = render_form(choices, credit=TEN, simulated=False, preview_url="/p")
    assert "95.6 GB · TFLOPS unknown, shared" in html and "0 FP16 TFLOPS" not in html
