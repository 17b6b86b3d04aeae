from spawner.core.placement import FreeView
from spawner.core.queue import WaitQueues, ordinal


def test_first_come_first_served_per_offering():
    q = WaitQueues()
    a = q.join("a/", "A100-80GB", 2)
    b = q.join("b/", "A100-80GB", 1)
    c = q.join("c/", "L40S", 1)
    assert (q.position("a/"), q.position("b/"), q.position("c/")) == (1, 2, 1)
    view = FreeView()
    view.set("A100-80GB", "n1", 1, 8)
    q.poke(view)
    # one free A100 fits b, but a is first and needs two: nobody jumps the line
    assert not a.woken.is_set() and not b.woken.is_set() and not c.woken.is_set()
    view.set("A100-80GB", "n1", 2, 8)
    q.poke(view)
    assert a.woken.is_set() and not b.woken.is_set()
    q.leave("a/")
    assert q.position("b/") == 1 and q.is_head("b/", "A100-80GB")
    q.leave("b/")
    assert q.waiting("A100-80GB") == 0 and q.position("b/") is None


def test_ordinals():
    assert [ordinal(n) for n in (1, 2, 3, 4, 11, 12, 13, 21, 22, 101, 111)] == [
        "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "101st", "111th"
    ]  # fmt: skip
