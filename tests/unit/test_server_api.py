"""The server API's answers as data: the choices a server can change to."""

from spawner.api.servers import choices_view
from spawner.core.catalog import Catalog
from spawner.core.form import Choice, CourseOffer
from spawner.core.placement import Alternative

CATALOG = Catalog.load()
SLICE = {"kind": "slice", "card": "A100-80GB", "mig_profile": "1g.10gb"}
RTX = {"kind": "card", "card": "RTX-4090", "count": 1}
T4_FREE = (Alternative(CATALOG.offering("T4"), 1, 1_500_000),)


def test_choices_put_course_funded_options_first_with_the_course_in_their_options():
    choices = [
        Choice(CATALOG.offering("A100-80GB/1g.10gb"), 2, 3, 1, 1_142_857),
        Choice(CATALOG.offering("RTX-4090"), 0, 2, 2, 5_000_000, T4_FREE),
        Choice(CATALOG.cpu, 1, 1, 1, 100_000),
    ]
    course = CourseOffer("ml-101", "Machine Learning 101", {"A100-80GB/1g.10gb": 4.5, "cpu": 9}, "")
    view = choices_view(choices, [course], current="RTX-4090", currency="credits", simulated=True)
    assert view["current"] == "RTX-4090" and view["simulated"] is True
    funded, *plain = view["choices"]
    assert funded["course"] == {"slug": "ml-101", "name": "Machine Learning 101"}
    assert funded["hours_left"] == 4.5
    assert funded["options"] == {**SLICE, "course": "ml-101"}
    assert [c["key"] for c in plain] == ["A100-80GB/1g.10gb", "RTX-4090", "cpu"]
    assert [c["course"] for c in plain] == [None, None, None]
    rtx = plain[1]
    assert (rtx["free"], rtx["total"], rtx["max_count"]) == (0, 2, 2)
    assert rtx["price_per_hour"] == "5.00" and rtx["options"] == RTX
    assert [a["key"] for a in rtx["alternatives"]] == ["T4"]
    assert plain[2]["options"] == {"kind": "cpu"}
