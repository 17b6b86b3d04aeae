import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spawner.core.catalog import Catalog
from spawner.core.placement import (
    CardRequest,
    CpuRequest,
    FreeView,
    Placement,
    Refusal,
    RequestError,
    SliceRequest,
    SpecRequest,
    canonical_options,
    parse_request,
    place,
)

CATALOG = Catalog.load()
PRICES = {
    "cpu": 100_000,
    "T4": 1_500_000,
    "RTX-4090": 5_000_000,
    "A100-80GB": 8_000_000,
    "A100-80GB/1g.10gb": 1_142_857,
    "A100-80GB/3g.40gb": 3_428_571,
    "H100-80GB": 12_000_000,
    "H100-80GB/1g.10gb": 900_000,
}


def view_of(rows):
    view = FreeView()
    for key, node, free, total in rows:
        view.set(key, node, free, total)
    return view


def test_card_request_goes_to_best_fitting_node():
    view = view_of([("A100-80GB", "a", 4, 8), ("A100-80GB", "b", 2, 8), ("A100-80GB", "c", 1, 8)])
    answer = place(CardRequest("A100-80GB", 2), view, CATALOG, PRICES)
    assert answer == Placement(CATALOG.offering("A100-80GB"), 2, "b", 8_000_000)


def test_ties_break_by_node_name():
    view = view_of([("T4", "n2", 1, 1), ("T4", "n1", 1, 1)])
    assert place(CardRequest("T4"), view, CATALOG, PRICES).node == "n1"


def test_sold_out_card_explains_and_lists_free_alternatives_that_fit():
    view = view_of(
        [
            ("A100-80GB", "a", 0, 8),
            ("H100-80GB", "b", 2, 8),
            ("T4", "c", 3, 4),
            ("H100-80GB/1g.10gb", "d", 7, 7),
        ]
    )
    answer = place(CardRequest("A100-80GB"), view, CATALOG, PRICES)
    assert isinstance(answer, Refusal)
    assert answer.reason == "No A100-80GB free now (0 of 8 free)"
    # only the H100 has >= 80 GB and >= 312 TFLOPS
    assert [a.offering.key for a in answer.alternatives] == ["H100-80GB"]
    assert "H100-80GB at 12.00/h (2 free)" in answer.message


def test_sold_out_slice_offers_cheaper_slices_when_nothing_bigger_fits():
    view = view_of([("A100-80GB/1g.10gb", "a", 0, 7), ("H100-80GB/1g.10gb", "b", 3, 7)])
    answer = place(SliceRequest("A100-80GB", "1g.10gb"), view, CATALOG, PRICES)
    assert isinstance(answer, Refusal)
    assert "H100-80GB 1g.10gb slice at 0.90/h (3 free)" in answer.message


def test_too_many_or_absent_cards_are_request_errors_not_sold_out():
    view = view_of([("A100-80GB", "a", 8, 8)])
    with pytest.raises(RequestError, match="at most 8"):
        place(CardRequest("A100-80GB", 9), view, CATALOG, PRICES)
    with pytest.raises(RequestError, match="no H100-80GB"):
        place(CardRequest("H100-80GB"), view, CATALOG, PRICES)


def test_spec_picks_cheapest_free_fit_including_slices():
    view = view_of(
        [
            ("A100-80GB", "a", 1, 8),
            ("A100-80GB/3g.40gb", "b", 1, 2),
            ("T4", "c", 4, 4),
        ]
    )
    answer = place(SpecRequest(32, 80, 1), view, CATALOG, PRICES)
    assert answer.offering.key == "A100-80GB/3g.40gb"
    # two GPUs: slices cannot be combined, so the whole card it is (if 2 free on one node)
    view.set("A100-80GB", "a", 2, 8)
    assert place(SpecRequest(32, 80, 2), view, CATALOG, PRICES).offering.key == "A100-80GB"


def test_spec_nothing_free_is_a_refusal_and_impossible_spec_an_error():
    view = view_of([("A100-80GB", "a", 0, 8), ("T4", "c", 2, 4)])
    answer = place(SpecRequest(32, 80, 1), view, CATALOG, PRICES)
    assert isinstance(answer, Refusal) and "T4" in answer.message
    with pytest.raises(RequestError, match="no machine here has"):
        place(SpecRequest(500, 0, 1), view, CATALOG, PRICES)


def test_cpu_is_always_placeable():
    answer = place(CpuRequest(), FreeView(), CATALOG, PRICES)
    assert answer.offering.key == "cpu" and answer.price_per_hour_micro == 100_000


def test_unpriced_offerings_are_never_placed():
    view = view_of([("L40S", "a", 4, 4)])
    with pytest.raises(RequestError, match="has no price"):
        place(CardRequest("L40S"), view, CATALOG, PRICES)


@pytest.mark.parametrize(
    "options,message",
    [
        ({"kind": "card", "card": "B300"}, "unknown card 'B300'"),
        ({"kind": "card", "card": "T4", "count": 0}, "at least 1"),
        ({"kind": "card", "card": "T4", "count": -2}, "at least 1"),
        ({"kind": "card", "card": "T4", "count": "two"}, "whole number"),
        ({"kind": "card", "card": "T4", "count": 1.5}, "whole number"),
        ({"kind": "card", "card": "T4", "count": True}, "whole number"),
        ({"kind": "card", "card": "T4", "count": 1000}, "more than one server"),
        ({"kind": "card", "card": 7}, "card must name a card"),
        ({"kind": "slice", "card": "T4", "profile": "1g.10gb"}, "T4 has no MIG profile"),
        ({"kind": "slice", "card": "A100-80GB", "profile": "1g.5gb"}, "its profiles: 1g.10gb"),
        ({"kind": "spec", "min_memory_gb": -1}, "must not be negative"),
        ({"kind": "spec", "min_tflops": "lots"}, "must be a number"),
        ({"kind": "gpu"}, "kind must be one of"),
        ({"kind": "card", "card": "T4", "colour": "red"}, "unknown option"),
        (["card"], "must be an object"),
    ],
)
def test_bad_options_say_what_is_wrong(options, message):
    with pytest.raises(RequestError, match=message):
        parse_request(options, CATALOG)


def test_good_options_parse():
    assert parse_request({}, CATALOG) == CpuRequest()
    assert parse_request({"kind": "card", "card": "T4", "count": "2"}, CATALOG) == CardRequest(
        "T4", 2
    )
    assert parse_request(
        {"kind": "spec", "min_memory_gb": "32", "min_tflops": 80, "count": 1}, CATALOG
    ) == SpecRequest(32, 80, 1)


# -- properties ---------------------------------------------------------------------------

KEYS = sorted(k for k in PRICES if k != "cpu")
NODES = ["n0", "n1", "n2", "n3"]


@st.composite
def inventories(draw):
    rows = []
    for key in KEYS:
        for node in NODES:
            if draw(st.booleans()):
                total = draw(st.integers(1, 8))
                rows.append((key, node, draw(st.integers(0, total)), total))
    return view_of(rows), rows


requests = st.one_of(
    st.builds(CardRequest, st.sampled_from(["T4", "RTX-4090", "A100-80GB", "H100-80GB"]),
              st.integers(1, 8)),
    st.builds(SliceRequest, st.sampled_from(["A100-80GB", "H100-80GB"]), st.just("1g.10gb")),
    st.builds(SpecRequest, st.sampled_from([0, 10, 16, 24, 40, 80]),
              st.sampled_from([0, 50, 100, 200, 400]), st.integers(1, 4)),
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(inventories(), requests)
def test_a_placement_never_exceeds_what_is_free(inventory, request):
    view, rows = inventory
    try:
        answer = place(request, view, CATALOG, PRICES)
    except RequestError:
        return
    if isinstance(answer, Placement):
        free = {(k, n): f for k, n, f, _ in rows}
        assert free[(answer.offering.key, answer.node)] >= answer.count
    else:
        for alt in answer.alternatives:
            assert alt.free > 0


@settings(max_examples=300, deadline=None)
@given(inventories(), requests.filter(lambda r: isinstance(r, SpecRequest)))
def test_a_spec_match_is_the_cheapest_free_fit(inventory, request):
    view, rows = inventory
    try:
        answer = place(request, view, CATALOG, PRICES)
    except RequestError:
        return
    fitting_prices = [
        PRICES[k]
        for k, _, free, _ in rows
        for o in (CATALOG.offering(k),)
        if free >= request.count
        and o.memory_gb >= request.min_memory_gb
        and o.fp16_tflops >= request.min_tflops
        and (o.kind == "card" or request.count == 1)
    ]
    if isinstance(answer, Placement):
        assert answer.price_per_hour_micro == min(fitting_prices)
        assert answer.offering.memory_gb >= request.min_memory_gb
        assert answer.offering.fp16_tflops >= request.min_tflops
    else:
        assert fitting_prices == []


@settings(max_examples=100, deadline=None)
@given(inventories(), requests)
def test_placement_is_deterministic(inventory, request):
    view, rows = inventory
    again = view_of(list(reversed(rows)))
    try:
        first = place(request, view, CATALOG, PRICES)
    except RequestError:
        return
    assert place(request, again, CATALOG, PRICES) == first


def test_free_view_updates_keep_aggregates():
    view = view_of([("T4", "a", 2, 4), ("T4", "b", 4, 4)])
    assert (view.free("T4"), view.total("T4"), view.max_free("T4")) == (6, 8, 4)
    view.take("T4", "b", 3)
    assert (view.free("T4"), view.max_free("T4"), view.max_capacity("T4")) == (3, 2, 4)
    view.set("T4", "b", 0, 0)
    assert (view.total("T4"), view.max_capacity("T4")) == (4, 4)


def test_shared_gpus_are_their_own_option_and_never_match_a_spec():
    prices = {**PRICES, "T4/shared": 375_000}
    view = view_of([("T4/shared", "ts", 8, 16), ("T4", "t", 0, 4)])
    answer = place(parse_request({"kind": "shared", "card": "T4"}, CATALOG), view, CATALOG, prices)
    assert answer.offering.key == "T4/shared" and answer.offering.kind == "shared"
    assert answer.offering.label == "T4 shared (time-sliced)"
    assert isinstance(place(SpecRequest(8, 10, 1), view, CATALOG, prices), Refusal)
    with pytest.raises(RequestError, match="unknown option"):
        parse_request({"kind": "shared", "card": "T4", "count": 2}, CATALOG)


@pytest.mark.parametrize("kind", [["card"], {"a": 1}, 3, None])
def test_a_kind_that_is_not_a_name_is_a_clear_error(kind):
    with pytest.raises(RequestError, match="kind must be one of"):
        parse_request({"kind": kind}, CATALOG)


def test_a_slice_names_its_mig_profile_and_the_older_key_still_works():
    new = {"kind": "slice", "card": "A100-80GB", "mig_profile": "1g.10gb"}
    old = {"kind": "slice", "card": "A100-80GB", "profile": "1g.10gb"}
    assert parse_request(new, CATALOG) == parse_request(old, CATALOG)
    # KubeSpawner's own load_user_options reads "profile": it never reaches the backend
    assert canonical_options(old) == new and canonical_options(new) == new
    with pytest.raises(RequestError, match="older name of mig_profile"):
        parse_request({**new, "profile": "2g.20gb"}, CATALOG)


@pytest.mark.parametrize("count", ["²", "٣", "1" * 5000, "12345", " "])
def test_a_count_int_cannot_read_is_a_request_error_not_a_crash(count):
    # "²".isdigit() and "٣".isdigit() are True, yet int() refuses both (and 5,000 digits)
    with pytest.raises(RequestError, match="whole number of GPUs"):
        parse_request({"kind": "card", "card": "T4", "count": count}, CATALOG)


@pytest.mark.parametrize(
    "options",
    [
        {"kind": "card", "card": "X" * 10_000},
        {"kind": "x" * 10_000},
        {"kind": "card", "card": "T4", "count": "x" * 10_000},
        {"kind": "card", "card": "T4", **{f"{i}" + "y" * 10_000: 1 for i in range(20)}},
        {"kind": "slice", "card": "A100-80GB", "mig_profile": "p" * 10_000},
        {"kind": "spec", "min_memory_gb": "m" * 10_000},
    ],
)
def test_a_refusal_never_echoes_a_long_value_whole(options):
    with pytest.raises(RequestError) as refused:
        parse_request(options, CATALOG)
    assert len(str(refused.value)) < 400
