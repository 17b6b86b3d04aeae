from spawner.core.catalog import Catalog
from spawner.core.form import Choice, credit_lasts, format_duration, options_from_form, render_form
from spawner.core.placement import Alternative

CATALOG = Catalog.load()


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
        available_micro=10_000_000,
        currency="credits",
        simulated=True,
        preview_url="/hub/gputap/preview",
    )
    assert "simulated" in html
    assert "3 of 3 free" in html and "1.142857/h" in html and "credit lasts 8 h 45 min" in html
    assert "sold out" in html and "Free now instead: A100-80GB 1g.10gb slice (3 free" in html
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
        available_micro=10_000_000,
        currency="credits",
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
