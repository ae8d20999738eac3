"""The price table: the shipped defaults, the overrides laid over them, the fallback."""

import json
import re

import pytest

from tests.trainops.cost.fixtures import FIXTURE_PRICES
from trainops.cost.prices import (
    DEFAULT_GPU_HOUR,
    DEFAULT_TABLE_PATH,
    default_table,
    load_prices,
    price_of,
)

COMMON = [
    "p4d.24xlarge",
    "p4de.24xlarge",
    "p5.48xlarge",
    "g5.xlarge",
    "g5.48xlarge",
    "g6.xlarge",
    "g6.48xlarge",
    "a2-highgpu-1g",
    "a2-highgpu-8g",
    "a2-ultragpu-8g",
    "a3-highgpu-8g",
    "g2-standard-4",
    "Standard_ND96asr_v4",
    "Standard_ND96amsr_A100_v4",
    "Standard_ND96isr_H100_v5",
    "Standard_NC24ads_A100_v4",
]


def test_the_default_table_covers_the_common_gpu_types_with_a_source_and_date_each():
    table = default_table()
    assert set(COMMON) <= set(table)
    for name, capacities in table.items():
        assert set(capacities) == {"spot", "on-demand"}, name
        spot, on_demand = capacities["spot"], capacities["on-demand"]
        assert 0 < spot["per_hour"] < on_demand["per_hour"], name
        assert spot["gpus"] == on_demand["gpus"] >= 1
        for price in (spot, on_demand):
            assert price["source"].startswith(
                ("list price as of 2024-12-01", "typical spot price as of 2024-12-01")
            )
            assert "https://" in price["source"] and price["date"] == "2024-12-01"
    assert table["p4d.24xlarge"] == FIXTURE_PRICES["p4d.24xlarge"]  # the fixture prices like the table


def test_the_shipped_file_says_prices_drift_and_how_to_override():
    comment = json.loads(DEFAULT_TABLE_PATH.read_text())["_comment"]
    assert "prices drift" in comment and "trainops_prices" in comment and "'prices' parameter" in comment


def test_a_known_type_is_priced_per_gpu_hour_from_its_instance_hour():
    priced = price_of(default_table(), "p5.48xlarge", "on-demand")
    assert priced == {
        "per_gpu_hour": pytest.approx(98.32 / 8),
        "source": default_table()["p5.48xlarge"]["on-demand"]["source"],
        "known": True,
    }


def test_an_unknown_type_falls_back_to_the_default_per_gpu_hour():
    assert price_of(default_table(), "p9.fake", "spot") == {
        "per_gpu_hour": DEFAULT_GPU_HOUR["spot"],
        "source": "default per-GPU-hour (unknown instance type p9.fake)",
        "known": False,
    }
    assert (
        price_of(default_table(), None, "on-demand")["source"]
        == "default per-GPU-hour (no instance type known)"
    )


def test_the_parameter_lies_over_the_variable_over_the_default_per_type_and_capacity():
    variable = json.dumps(
        {"p4d.24xlarge": {"spot": {"per_hour": 10.0}}, "my.gpu": {"on-demand": {"per_hour": 6, "gpus": 2}}}
    )
    param = {
        "p4d.24xlarge": {"spot": {"per_hour": 8.0, "gpus": 8, "source": "our EDP", "date": "2026-11-01"}}
    }
    table, sources = load_prices(param, variable)
    assert sources == "prices parameter + Variable trainops_prices + default table"
    assert table["p4d.24xlarge"]["spot"] == {
        "per_hour": 8.0,
        "gpus": 8,
        "source": "our EDP",
        "date": "2026-11-01",
    }
    assert table["p4d.24xlarge"]["on-demand"] == default_table()["p4d.24xlarge"]["on-demand"]  # untouched
    assert price_of(table, "my.gpu", "on-demand") == {
        "per_gpu_hour": 3.0,
        "source": "Variable trainops_prices",
        "known": True,
    }
    assert price_of(table, "my.gpu", "spot")["source"] == "default per-GPU-hour (no spot price for my.gpu)"
    only_variable, sources = load_prices(None, variable)
    assert only_variable["p4d.24xlarge"]["spot"]["per_hour"] == 10.0  # gpus taken from the default
    assert sources == "Variable trainops_prices + default table"
    assert load_prices(None, None) == (default_table(), "default table")


def test_an_override_can_set_the_per_gpu_hour_fallback():
    table, _ = load_prices('{"*": {"spot": {"per_hour": 0.9, "gpus": 1}}}', None)
    assert price_of(table, "p9.fake", "spot")["per_gpu_hour"] == 0.9
    assert price_of(table, "p9.fake", "on-demand")["per_gpu_hour"] == DEFAULT_GPU_HOUR["on-demand"]


@pytest.mark.parametrize(
    ("param", "message"),
    [
        ("{not json", "prices parameter is not valid JSON"),
        ([1, 2], "prices parameter: expected a JSON object of instance type -> capacity"),
        (
            {"p4d.24xlarge": {"preemptible": {"per_hour": 1}}},
            "p4d.24xlarge preemptible: the capacity must be",
        ),
        ({"p4d.24xlarge": {"spot": {"per_hour": "cheap"}}}, "p4d.24xlarge spot: per_hour must be a number"),
        ({"p4d.24xlarge": {"spot": {"per_hour": -1}}}, "p4d.24xlarge spot: per_hour must be >= 0"),
        ({"new.type": {"spot": {"per_hour": 1.0}}}, "new.type spot: gpus must be the instance type's"),
        ({"p4d.24xlarge": "cheap"}, "'p4d.24xlarge' must map capacities"),
    ],
)
def test_a_bad_table_is_refused_naming_the_entry(param, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        load_prices(param, None)


def test_a_bad_variable_is_refused_naming_the_variable():
    with pytest.raises(ValueError, match=re.escape("Variable trainops_prices: p5.48xlarge spot: per_hour")):
        load_prices(None, '{"p5.48xlarge": {"spot": {"per_hour": null}}}')


def test_an_unknown_capacity_has_no_price():
    with pytest.raises(ValueError, match="capacity 'spot-then-on-demand' has no price"):
        price_of(default_table(), "p4d.24xlarge", "spot-then-on-demand")
