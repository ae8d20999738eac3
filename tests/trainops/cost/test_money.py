"""The one money rule: cents from a cent up, two significant digits below, and every place that
writes an amount (report pages, ``python -m trainops cost``, the estimate) writes it the same way."""

from __future__ import annotations

import pytest

from tests.trainops.cost.fixtures import one_preemption_cost
from trainops.cost.money import money


@pytest.mark.parametrize(
    ("amount", "text"),
    [
        (0, "$0.00"),
        (0.0, "$0.00"),
        (0.01, "$0.01"),
        (0.123456, "$0.12"),
        (12, "$12.00"),
        (1234.567, "$1,234.57"),
        (0.0042, "$0.0042"),  # a demo run: a fraction of a cent is not "$0.00"
        (0.005, "$0.0050"),
        (0.0099, "$0.0099"),
        (0.00996, "$0.01"),  # rounds up to a cent: written in cents
        (0.000012345, "$0.000012"),  # plain decimals, never 1.2e-05
        (-0.5, "-$0.50"),
        (-0.00042, "-$0.00042"),
        (None, "-"),
        (float("nan"), "-"),
        (float("inf"), "-"),
        (True, "-"),
        ("1.00", "-"),
    ],
)
def test_the_one_rule(amount, text):
    assert money(amount) == text


def test_the_pages_the_cli_and_the_estimate_write_a_tiny_amount_alike():
    from trainops.cli.cost import render
    from trainops.cost.estimate import estimate_lines
    from trainops.reports.cost_page import cost_table

    cost = one_preemption_cost()
    tiny = {**cost, "cost": 0.0042, "on_demand_cost": 0.012, "savings": 0.0078}
    assert "<td>$0.0042</td>" in cost_table(tiny)
    assert "estimated cost                            $0.0042" in render(tiny, "file:///r", "default table")
    estimate = {
        "steps": 10,
        "step_s": 0.1,
        "step_time_source": "preset FLOPs",
        "hours": 1 / 3600,
        "accelerators": 1,
        "gpu_hours": 1 / 3600,
        "instance_type": None,
        "capacity": "spot",
        "currency": "USD",
        "spot_cost": 0.0042,
        "on_demand_cost": 0.012,
        "assumptions": [],
    }
    assert "  spot $0.0042, on-demand $0.01: spot saves $0.0078 (65%) if no preemption comes" in (
        estimate_lines(estimate)  # type: ignore[arg-type]
    )
