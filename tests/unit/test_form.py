import re

import pytest

from spawner.core.asking import Credit, Refused
from spawner.core.catalog import Catalog
from spawner.core.form import (
    Choice,
    CourseOffer,
    credit_lasts,
    format_duration,
    options_from_form,
    render_form,
    with_alternatives,
)
from spawner.core.placement import Alternative, RequestError, parse_options

CATALOG = Catalog.load()
#: 10.00 of trial credit, nothing held; a server must be able to pay its first minute
TEN = Credit(10_000_000, 0, 10_000_000, 10_000_000, min_billable_seconds=60)


def test_credit_lasts_exactly():
    assert credit_lasts(10_000_000, 5_000_000) == 7200
    assert credit_lasts(10_000_000, 6_666_667) == 5399  # whole seconds, never more than paid
    assert credit_lasts(-5, 1_000_000) == 0
    assert format_duration(7200) == "2 h 00 min"
    assert format_duration(5399) == "1 h 29 min"
    assert format_duration(59) == "under 1 min"


def test_form_shows_each_option_with_numbers_and_sold_out_alternatives():
    a100 = CATALOG.offering("A100-80GB")
    slice_ = CATALOG.offering("A100-80GB/1g.10gb")
    choices = [
        Choice(slice_, 3, 3, 1, 1_142_857),
        Choice(a100, 0, 1, 1, 8_000_000, (Alternative(slice_, 3, 1_142_857),)),
        Choice(CATALOG.cpu, 1, 1, 1, 100_000),
    ]
    html = render_form(
        choices,
        credit=TEN,
        simulated=True,
        preview_url="/hub/gputap/preview",
    )
    assert "simulated" in html
    assert "3 of 3 free" in html and "1.142857/h" in html and "credit lasts 8 h 45 min" in html
    assert "sold out" in html and "Free now instead: " in html
    assert 'data-pick="slice:A100-80GB/1g.10gb">A100-80GB 1g.10gb slice (3 free' in html
    assert 'value="card:A100-80GB">' in html  # selectable: the user may wait in the queue
    assert 'name="queue"' in html and 'name="spot"' not in html
    assert 'value="slice:A100-80GB/1g.10gb" checked' in html


def test_form_fields_become_the_same_user_options_as_the_api():
    assert options_from_form({"choice": ["slice:A100-80GB/1g.10gb"]}) == {
        "kind": "slice",
        "card": "A100-80GB",
        "mig_profile": "1g.10gb",
    }
    assert options_from_form({"choice": ["card:RTX-4090"], "count:RTX-4090": ["2"]}) == {
        "kind": "card",
        "card": "RTX-4090",
        "count": "2",
    }
    assert options_from_form(
        {"choice": ["spec"], "spec_min_memory_gb": ["32"], "spec_min_tflops": ["80"]}
    ) == {"kind": "spec", "min_memory_gb": "32", "min_tflops": "80", "count": "1"}
    assert options_from_form({"choice": ["cpu"]}) == {"kind": "cpu"}
    assert options_from_form({"choice": ["card:T4"], "queue": ["on"], "spot": ["on"]}) == {
        "kind": "card",
        "card": "T4",
        "count": "1",
        "queue": True,
        "spot": True,
    }


def test_course_funded_options_come_first_with_hours_left():
    from spawner.core.form import CourseOffer, course_offers
    from spawner.core.placement import RequestError, parse_options

    slice_ = CATALOG.offering("A100-80GB/1g.10gb")
    t4 = CATALOG.offering("T4")
    choices = [Choice(slice_, 3, 3, 1, 1_142_857), Choice(t4, 1, 1, 1, 1_500_000)]
    [course] = course_offers(
        {
            "courses": [
                {
                    "slug": "dl101",
                    "name": "Intro to DL",
                    "hours_left": {"A100-80GB/1g.10gb": 4.56, "T4": 0.0},
                    "reset_weekday": "monday",
                    "reset_time": "08:00",
                    "timezone": "Europe/Berlin",
                }
            ]
        }
    )
    assert course == CourseOffer(
        "dl101", "Intro to DL", {"A100-80GB/1g.10gb": 4.56, "T4": 0.0}, "Monday 08:00 Europe/Berlin"
    )
    html = render_form(
        choices,
        credit=TEN,
        simulated=False,
        preview_url="/p",
        courses=[course],
    )
    assert html.index("Paid by Intro to DL") < html.index("MIG slices")
    assert "4.5 h left this week (Intro to DL)" in html
    assert 'value="course:dl101:slice:A100-80GB/1g.10gb" checked' in html
    assert 'value="course:dl101:card:T4" disabled' in html  # no hours left on it
    options = options_from_form({"choice": ["course:dl101:slice:A100-80GB/1g.10gb"]})
    assert options == {
        "kind": "slice",
        "card": "A100-80GB",
        "mig_profile": "1g.10gb",
        "course": "dl101",
    }
    assert parse_options(options, CATALOG).course == "dl101"
    bad_courses = ({"course": 5}, {"course": "Not A Slug"}, {"course": "dl101\n"})
    for bad in (*bad_courses, {"course": "dl101", "spot": True}):
        try:
            parse_options({"kind": "card", "card": "T4", **bad}, CATALOG)
        except RequestError as e:
            assert "course" in str(e)
        else:
            raise AssertionError(f"{bad} was accepted")


def test_an_option_the_credit_cannot_start_is_marked_with_the_reason():
    a100 = CATALOG.offering("A100-80GB")
    rtx = CATALOG.offering("RTX-4090")
    poor = Credit(50_000, 0, 50_000, 50_000, min_billable_seconds=60)
    choices = [Choice(rtx, 2, 2, 2, 5_000_000), Choice(a100, 1, 1, 1, 8_000_000)]
    html = render_form(choices, credit=poor, simulated=False, preview_url="/p")
    # 8.00/h for 60 s is 0.133333; 5.00/h is 0.083333: neither fits in 0.05
    assert 'value="card:A100-80GB" disabled' in html
    assert (
        "Not enough credit: needs 0.133333 credits for the first 1 min (the least a server "
        "is billed); you have 0.05." in html
    )
    # one RTX-4090 fits 0.10 of credit, two do not: the count of two is marked
    some = Credit(100_000, 0, 100_000, 100_000, min_billable_seconds=60)
    html = render_form(choices, credit=some, simulated=False, preview_url="/p")
    assert 'value="card:RTX-4090" checked' in html
    assert '<option value="2" disabled>2</option>' in html


def posted(html: str) -> dict[str, list[str]]:
    """The fields a browser posts from the form as rendered, untouched: its hidden inputs and
    the checked radio, if any."""
    fields: dict[str, list[str]] = {}
    for tag in re.findall(r"<input [^>]*>", html):
        name, value = re.search(r'name="([^"]*)"', tag), re.search(r'value="([^"]*)"', tag)
        if 'type="hidden"' in tag or ('type="radio"' in tag and " checked" in tag):
            fields.setdefault(name.group(1), []).append(value.group(1))
    return fields


def test_a_form_with_nothing_within_the_credit_says_why_and_so_does_its_start():
    rtx = CATALOG.offering("RTX-4090")
    broke = Credit(0, 0, 0, 0, min_billable_seconds=60)
    choices = [Choice(rtx, 2, 2, 1, 5_000_000), Choice(CATALOG.cpu, 1, 1, 1, 100_000)]
    html = render_form(choices, credit=broke, simulated=False, preview_url="/p")
    assert "No option is within your credit" in html  # said before Start is pressed
    fields = posted(html)
    assert "choice" not in fields
    with pytest.raises(RequestError) as refused:
        parse_options(options_from_form(fields), CATALOG)
    message = str(refused.value)
    assert message.startswith("No option is within your credit")
    assert "add credit" in message and "instructor" in message
    assert "kind must be" not in message


def test_a_form_posted_without_a_pick_says_so_when_something_was_within_the_credit():
    a100 = CATALOG.offering("A100-80GB")
    choices = [Choice(a100, 0, 1, 1, 8_000_000)]  # affordable but sold out: nothing preselected
    html = render_form(choices, credit=TEN, simulated=False, preview_url="/p")
    assert "No option is within your credit" not in html
    with pytest.raises(RequestError, match="^No option was picked: pick one"):
        parse_options(options_from_form(posted(html)), CATALOG)


def test_course_hours_are_within_reach_without_credit():
    t4 = CATALOG.offering("T4")
    broke = Credit(0, 0, 0, 0, min_billable_seconds=60)
    course = CourseOffer("dl101", "Intro to DL", {"T4": 2.0}, "Monday 00:00 UTC")
    html = render_form(
        [Choice(t4, 1, 1, 1, 350_000)], credit=broke, simulated=False, preview_url="/p",
        courses=[course],
    )  # fmt: skip
    assert "No option is within your credit" not in html
    assert options_from_form(posted(html))["course"] == "dl101"


def test_a_refused_start_selects_what_was_picked_and_offers_what_is_free():
    a100 = CATALOG.offering("A100-80GB")
    slice_ = CATALOG.offering("A100-80GB/1g.10gb")
    choices = [
        Choice(slice_, 3, 3, 1, 1_142_857),
        Choice(a100, 0, 1, 1, 8_000_000, (Alternative(slice_, 3, 1_142_857),)),
    ]
    refused = Refused(
        "No A100-80GB free now (0 of 1 free).",
        {"kind": "card", "card": "A100-80GB", "count": "1", "queue": False},
        typed={"choice": "card:A100-80GB", "spec_min_memory_gb": "40", "spec_count": "2"},
    )
    html = render_form(
        choices,
        credit=TEN,
        simulated=False,
        preview_url="/p",
        refused=with_alternatives(refused, choices, TEN),
    )
    assert "<p>No A100-80GB free now (0 of 1 free).</p>" in html
    assert 'value="card:A100-80GB" checked' in html  # still what the user picked
    assert 'value="slice:A100-80GB/1g.10gb" checked' not in html
    assert 'name="spec_min_memory_gb" min="0" step="any" value="40"' in html  # as typed
    assert 'name="spec_count" min="1" step="1" value="2"' in html
    box = html[html.index('id="gputap-refusal"') : html.index("</div></div>")]
    assert 'data-pick="slice:A100-80GB/1g.10gb"' in box
    # an alternative's text is a button outside every label: it selects its own row only
    row = html[html.index('data-key="A100-80GB"') :]
    row = row[: row.index("</div></div>") + 12]
    label_ends = row.rindex("</label>")
    assert row.index('class="gputap-pick"') > label_ends
