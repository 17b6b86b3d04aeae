"""The chart's PriorityClasses against the cluster autoscaler and the scheduler.

cluster-autoscaler counts a pod as expendable when its priority is below
``--expendable-pods-priority-cutoff`` (default -10; ``IsExpendablePod``: ``priority <
cutoff``): it never scales up for such a pod and removes a node running only such pods as
if it were empty. Spot servers must not be expendable, or the autoscaler would stop them
without the scheduler's Preempted event that tells the user why.
"""

from __future__ import annotations

import pytest

from tests.helm.test_chart import (
    IDS,
    VALUE_FILES,
    chart_dir,  # noqa: F401 (the fixture)
    render,
    values_of,
)

#: cluster-autoscaler's default --expendable-pods-priority-cutoff
AUTOSCALER_CUTOFF = -10


def classes(manifests: list[dict]) -> list[dict]:
    """The rendered PriorityClasses, lowest value (spot) first."""
    return sorted((m for m in manifests if m["kind"] == "PriorityClass"), key=lambda m: m["value"])


@pytest.mark.parametrize("values_file", VALUE_FILES, ids=IDS)
def test_spot_is_below_on_demand_and_not_expendable_to_the_autoscaler(
    chart_dir,  # noqa: F811
    values_file,
):
    spot, on_demand = classes(render(chart_dir, values_of(values_file)))
    assert spot["metadata"]["name"].endswith("spot"), spot["metadata"]["name"]
    assert AUTOSCALER_CUTOFF <= spot["value"] < on_demand["value"]
    # spot takes only what is free; on-demand makes spot servers give way
    assert spot["preemptionPolicy"] == "Never"
    assert on_demand["preemptionPolicy"] == "PreemptLowerPriority"


def test_a_preemption_policy_kubernetes_does_not_know_is_refused(chart_dir):  # noqa: F811
    with pytest.raises(Exception, match="preemptionPolicy"):
        render(chart_dir, {"priorityClasses": {"spot": {"preemptionPolicy": "Sometimes"}}})
