"""The environment a start gets (spawner/lifecycle/environment.py), against a stand-in of
billing's courses answer: the default, the user's groups and courses, a course's pin, and
400s (503 when billing cannot say which courses the user takes) before anything starts."""

from types import SimpleNamespace

import pytest
from tornado import web

from spawner.core.catalog import Catalog
from spawner.core.placement import parse_options
from spawner.lifecycle.billing_client import BillingUnavailable
from spawner.lifecycle.environment import EnvironmentChoice

CATALOG = Catalog.load()
ENVIRONMENTS = {
    "gputap": {"name": "gputap minimal", "default": True},
    "torch": {"name": "PyTorch", "needs": {"gpu": True}},
    "vision": {"name": "Vision course", "allowed": {"courses": ["cv-2026"]}},
}
T4 = {"kind": "card", "card": "T4"}


class Billing:
    """Billing's answer to GET api/accounts/{user}/courses."""

    def __init__(self, courses=(), up=True):
        self.taken = list(courses)
        self.up = up
        self.asked = 0

    async def courses(self, username):
        self.asked += 1
        if not self.up:
            raise BillingUnavailable("billing unreachable: Connection refused")
        return {"courses": self.taken}


class Spawner(EnvironmentChoice):
    catalog = CATALOG

    def __init__(self, billing, environments=ENVIRONMENTS, groups=()):
        super().__init__(environments=environments, catalog=CATALOG)
        self.billing = billing
        self.user = SimpleNamespace(name="stu", groups=[SimpleNamespace(name=g) for g in groups])


def course(slug, environment=""):
    return {"slug": slug, "environment": environment}


async def chosen(spawner, options):
    environment, _ = await spawner.environment_for(parse_options(options, CATALOG))
    return environment.key


async def refused(spawner, options) -> web.HTTPError:
    with pytest.raises(web.HTTPError) as e:
        await spawner.environment_for(parse_options(options, CATALOG))
    return e.value


async def test_a_course_opens_its_environment_to_its_students_only():
    assert await chosen(Spawner(Billing([course("cv-2026")])), {**T4, "environment": "vision"}) == (
        "vision"
    )
    e = await refused(Spawner(Billing([course("nlp")])), {**T4, "environment": "vision"})
    assert e.status_code == 400
    assert "'vision' is not one of yours; you may use: gputap, torch" in e.log_message


async def test_billing_is_asked_for_courses_only_where_an_environment_needs_them():
    billing = Billing()
    plain = {k: v for k, v in ENVIRONMENTS.items() if k != "vision"}
    assert await chosen(Spawner(billing, plain), T4) == "gputap"
    assert billing.asked == 0
    e = await refused(Spawner(Billing(up=False)), T4)
    assert e.status_code == 503 and "nothing is charged" in e.log_message


async def test_a_course_pins_its_environment_on_the_servers_it_pays_for():
    billing = Billing([course("dl-2026", "torch"), course("cv-2026")])
    spawner = Spawner(billing, {k: v for k, v in ENVIRONMENTS.items() if k != "vision"})
    assert await chosen(spawner, {**T4, "course": "dl-2026"}) == "torch"
    assert await chosen(spawner, {**T4, "course": "dl-2026", "environment": "torch"}) == "torch"
    e = await refused(spawner, {**T4, "course": "dl-2026", "environment": "gputap"})
    assert e.status_code == 400 and e.log_message.endswith(
        "course dl-2026 runs its servers in environment torch; leave environment out, or "
        "start without the course"
    )
    # the pin's needs hold too: torch needs a GPU
    e = await refused(spawner, {"kind": "cpu", "course": "dl-2026"})
    assert "environment torch needs a GPU" in e.log_message
    # the user's own credit: their choice
    assert await chosen(spawner, {**T4, "environment": "gputap"}) == "gputap"
    assert await chosen(spawner, {**T4, "course": "cv-2026"}) == "gputap"
