"""A run's bill as it ends: estimated from its ``job.json`` and metrics with the price table
(the ``prices`` parameter over the Variable ``trainops_prices`` and the shipped table), put
into the record and said in the task log. An estimate never fails the task."""

from __future__ import annotations

from typing import Any, Protocol

from airflow.sdk import Variable

from trainer.contract import MetricsReader
from trainer.storage import Storage
from trainops.cost.accounting import account
from trainops.cost.money import money
from trainops.cost.prices import PRICES_VARIABLE, load_prices
from trainops.recovery.record import JobRecord


class TaskLog(Protocol):
    """The task log (the operator's ``log``)."""

    def info(self, msg: str, /, *args: object) -> object: ...

    def warning(self, msg: str, /, *args: object) -> object: ...


def prices_variable() -> str | None:
    """The Variable ``trainops_prices`` (JSON text), None when it is not set."""
    value = Variable.get(PRICES_VARIABLE, default=None)
    return None if value is None else str(value)


def with_bill(
    job: JobRecord, store: Storage, run_uri: str, prices: dict[str, Any] | str | None, log: TaskLog
) -> JobRecord:
    """``job`` with the run's bill (``"cost"``, a ``RunCost``), as it ended; logged in one line.
    If it cannot be made, ``job`` is returned as it was, with a warning.

    :param store: the run's storage; ``run_uri``: the run (its metrics are read).
    :param prices: the operator's ``prices`` parameter (checked before launch).
    :param log: the task log.
    """
    try:
        table, sources = load_prices(prices, prices_variable())
    except ValueError as exc:  # the parameter was checked: the Variable is at fault
        log.warning("Variable %s ignored for the cost estimate: %s", PRICES_VARIABLE, exc)
        table, sources = load_prices(prices, None)
    try:
        cost = account(job, MetricsReader(store, run_uri).records(), table)
    except Exception as exc:  # an estimate: a fault in it must not fail a finished run
        log.warning("no cost estimate for %s: %s", run_uri, exc)
        return job
    goodput = "-" if cost["goodput"] is None else f"{cost['goodput']:.1%}"
    log.info(
        "estimated cost (prices: %s): %s, on-demand %s, savings %s; %.3f GPU-hours "
        "billed, goodput %s; python -m trainops cost %s for the breakdown",
        sources,
        money(cost["cost"]),
        money(cost["on_demand_cost"]),
        money(cost["savings"]),
        cost["billed_gpu_hours"],
        goodput,
        run_uri,
    )
    for warning in cost["warnings"]:  # a clock that disagrees with the cluster's
        log.warning("cost estimate: %s", warning)
    return {**job, "cost": dict(cost)}
