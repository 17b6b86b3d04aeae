from datetime import UTC, datetime

import pytest

from spawner.core.record import ServerRecord

STARTED = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)


def test_a_record_survives_the_hubs_state_both_ways():
    local = ServerRecord(
        session_id="s-1",
        offering="A100-80GB/1g.10gb",
        count=1,
        course="dl101",
        devices=("MIG-aaa",),
        simulated=True,
        hold_id="s-1",
    )
    kube = ServerRecord(
        session_id="s-2",
        offering="L40S",
        count=2,
        price_class="spot",
        node="gpu-l40s",
        started_at=STARTED,
    )
    for record in (local, kube):
        assert ServerRecord.from_state(record.to_state()) == record


def test_records_saved_before_they_were_typed_still_load():
    # the dicts gputap kept in spawner state before: one machine, then Kubernetes
    old_local = {
        "session_id": "s-1",
        "offering": "T4",
        "count": 1,
        "devices": ["GPU-1"],
        "simulated": False,
        "course": "",
        "started_at": STARTED.isoformat(),
    }
    old_kube = {
        "session_id": "s-2",
        "offering": "cpu",
        "count": 1,
        "node": None,
        "price_class": "on-demand",
        "course": "",
        "hold_id": "s-2",
    }
    local = ServerRecord.from_state(old_local)
    assert local.devices == ("GPU-1",) and local.started_at == STARTED
    assert local.price_class == "on-demand"
    kube = ServerRecord.from_state(old_kube)
    assert kube.node is None and kube.hold_id == "s-2" and kube.devices == ()


@pytest.mark.parametrize(
    "bad,message",
    [({"session_id": ""}, "session_id"), ({"count": 0}, "count"), ({"price_class": "x"}, "price")],
)
def test_a_record_that_could_not_be_billed_is_refused(bad, message):
    fields = {"session_id": "s", "offering": "T4", "count": 1, **bad}
    with pytest.raises(ValueError, match=message):
        ServerRecord(**fields)
