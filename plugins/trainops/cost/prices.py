"""Prices per instance-hour, by instance type and capacity, and where each figure comes from.

Three sources, each laid over the next per instance type and capacity: the operator's
``prices`` parameter, the JSON Variable ``trainops_prices``, and the table shipped next to this
module (``default_prices.json``: list prices and typical spot prices of common GPU instance
types of AWS, GCP and Azure, each with its source and date). So an override names only the
types it changes. An instance type no table knows is priced per GPU-hour
(:data:`DEFAULT_GPU_HOUR`, or the ``"*"`` entry of an override), and the cost report says so.
Every figure is an estimate: prices drift, and spot prices move by zone and hour.
"""

# No ``from __future__ import annotations``: TypedDict reads its annotations at run time.
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypedDict

CAPACITY_KINDS = ("spot", "on-demand")
PRICES_VARIABLE = "trainops_prices"
PARAMETER_SOURCE, VARIABLE_SOURCE, DEFAULT_SOURCE = (
    "prices parameter",
    f"Variable {PRICES_VARIABLE}",
    "default table",
)
DEFAULT_TABLE_PATH = Path(__file__).with_name("default_prices.json")
# The instance type of an override's per-GPU-hour fallback for instance types no table knows.
ANY_TYPE = "*"
# USD per GPU-hour for an instance type no table knows: about an A100's list price, and 35% of
# it on spot, like the shipped table's spot figures.
DEFAULT_GPU_HOUR = {"spot": 1.40, "on-demand": 4.00}


class Price(TypedDict):
    """One instance type at one capacity: USD per instance-hour (the whole node, all its
    ``gpus``), where the figure comes from and when it was read (YYYY-MM-DD)."""

    per_hour: float
    gpus: int
    source: str
    date: str


# instance type -> capacity ("spot" | "on-demand") -> Price
PriceTable = dict[str, dict[str, Price]]


class Priced(TypedDict):
    """What one accelerator-hour of an attempt costs, and why: ``known`` is False when the
    instance type is in no table and the per-GPU-hour fallback priced it."""

    per_gpu_hour: float
    source: str
    known: bool


def default_table() -> PriceTable:
    """The shipped table (``default_prices.json``)."""
    data = json.loads(DEFAULT_TABLE_PATH.read_text())
    return parse_table(data, DEFAULT_SOURCE, {})


def parse_table(data: object, origin: str, under: PriceTable) -> PriceTable:
    """``data`` (a mapping, or ``{"prices": mapping}`` as the shipped file has it) checked as a
    :class:`PriceTable`; an entry may leave out ``gpus`` when ``under`` prices the same type,
    and ``source`` and ``date`` (then ``origin`` is the source).

    :raises ValueError: naming the entry that is wrong and what it must be.
    """
    if isinstance(data, Mapping) and isinstance(data.get("prices"), Mapping):
        data = data["prices"]
    if not isinstance(data, Mapping):
        raise ValueError(
            f"{origin}: expected a JSON object of instance type -> capacity -> "
            f'{{"per_hour": USD, "gpus": N}}, got {str(data)[:100]!r}'
        )
    table: PriceTable = {}
    for instance_type, capacities in data.items():
        if not isinstance(instance_type, str) or not isinstance(capacities, Mapping) or not capacities:
            raise ValueError(
                f"{origin}: {instance_type!r} must map capacities ('spot', 'on-demand') to prices, "
                f"got {capacities!r}"
            )
        table[instance_type] = {}
        for capacity, entry in capacities.items():
            where = f"{origin}: {instance_type} {capacity}"
            if capacity not in CAPACITY_KINDS:
                raise ValueError(f"{where}: the capacity must be one of {CAPACITY_KINDS}")
            below = under.get(instance_type, {})
            table[instance_type][capacity] = _price(entry, where, origin, next(iter(below.values()), None))
    return table


def _price(entry: object, where: str, origin: str, below: Price | None) -> Price:
    if not isinstance(entry, Mapping):
        raise ValueError(f'{where}: expected {{"per_hour": USD, "gpus": N}}, got {entry!r}')
    per_hour, gpus = entry.get("per_hour"), entry.get("gpus", below["gpus"] if below else None)
    if isinstance(per_hour, bool) or not isinstance(per_hour, int | float) or not math.isfinite(per_hour):
        raise ValueError(f"{where}: per_hour must be a number of USD per instance-hour, got {per_hour!r}")
    if per_hour < 0:
        raise ValueError(f"{where}: per_hour must be >= 0, got {per_hour!r}")
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        raise ValueError(
            f"{where}: gpus must be the instance type's accelerator count (an integer >= 1), got {gpus!r}"
        )
    source, date = entry.get("source", origin), entry.get("date", "")
    if not isinstance(source, str) or not isinstance(date, str):
        raise ValueError(f"{where}: source and date must be strings, got {source!r} and {date!r}")
    return {"per_hour": float(per_hour), "gpus": gpus, "source": source, "date": date}


def _overlay(base: PriceTable, top: PriceTable) -> PriceTable:
    out = {name: dict(capacities) for name, capacities in base.items()}
    for name, capacities in top.items():
        out.setdefault(name, {}).update(capacities)
    return out


def _as_data(value: Mapping[str, Any] | str, origin: str) -> object:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError as exc:
            raise ValueError(f"{origin} is not valid JSON ({exc}); give a JSON object of prices") from exc
    return value


def load_prices(param: Mapping[str, Any] | str | None, variable_json: str | None) -> tuple[PriceTable, str]:
    """The price table, and which sources made it (``"prices parameter + default table"``):
    the operator parameter over the Variable ``trainops_prices`` over the shipped table.

    :param param: the operator's ``prices`` (a mapping, or JSON text); None: not given.
    :param variable_json: the Variable's JSON text; None: the Variable is not set.
    :raises ValueError: naming the entry that is wrong.
    """
    table, used = default_table(), [DEFAULT_SOURCE]
    for value, origin in ((variable_json, VARIABLE_SOURCE), (param, PARAMETER_SOURCE)):
        if value is None or value == "":
            continue
        table = _overlay(table, parse_table(_as_data(value, origin), origin, table))
        used.insert(0, origin)
    return table, " + ".join(used)


def price_of(table: PriceTable, instance_type: str | None, capacity: str) -> Priced:
    """USD per accelerator-hour of ``instance_type`` at ``capacity`` (``spot`` or
    ``on-demand``): the table's instance-hour price over its GPUs, else the per-GPU-hour
    fallback (the table's ``"*"`` entry, else :data:`DEFAULT_GPU_HOUR`)."""
    if capacity not in CAPACITY_KINDS:
        raise ValueError(f"capacity {capacity!r} has no price; expected one of {CAPACITY_KINDS}")
    known = table.get(instance_type or "", {}).get(capacity)
    if known is not None and instance_type != ANY_TYPE:
        return {"per_gpu_hour": known["per_hour"] / known["gpus"], "source": known["source"], "known": True}
    fallback = table.get(ANY_TYPE, {}).get(capacity)
    per_gpu_hour = fallback["per_hour"] / fallback["gpus"] if fallback else DEFAULT_GPU_HOUR[capacity]
    if not instance_type:
        what = "no instance type known"
    elif instance_type in table:
        what = f"no {capacity} price for {instance_type}"
    else:
        what = f"unknown instance type {instance_type}"
    return {"per_gpu_hour": per_gpu_hour, "source": f"default per-GPU-hour ({what})", "known": False}
