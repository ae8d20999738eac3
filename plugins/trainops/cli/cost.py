"""``python -m trainops cost RUN [--prices FILE]``: what one training run cost, estimated.

RUN is the run's URI, its folder (a relative path too), ``<dag_id>/<run_id>`` or ``latest``
(:mod:`trainops.runs.refs`, under ``--storage-root``). Reads the run's ``job.json`` (``s3://``
through the Airflow connection ``aws_default`` when it is defined, else boto3's default
credentials, as the operator reads it); a missing credential is one line naming them, exit
status 2. A run that ended
since this version holds its bill (``"cost"``, priced when it ended); an older or still
running run, or ``--prices``, prices it now from ``job.json`` and the run's metrics.
:func:`render` is a pure function of the bill.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import TYPE_CHECKING

from trainer.contract import MetricsReader, RunLayout
from trainer.storage import NotFound, StorageError, open_storage
from trainops.cli.devenv import storage_root_choice
from trainops.cost.accounting import PHASES, account, stored_cost
from trainops.cost.money import money
from trainops.cost.prices import PARAMETER_SOURCE, load_prices
from trainops.hooks.storage import storage_for
from trainops.runs.refs import LATEST, RunRefError, resolve
from trainops.shapes import check_job, load

if TYPE_CHECKING:
    from trainops.cost.accounting import RunCost

PHASE_LABELS = {
    "queued": "queued (not billed)",
    "startup": "startup",
    "productive": "productive",
    "replayed": "replayed (steps lost)",
    "checkpoint_stall": "checkpoint stall",
    "shutdown": "shutdown",
}


def render(cost: RunCost, run_uri: str, prices_from: str) -> str:
    """The bill as a person reads it: phases per attempt (seconds) and in total (seconds and
    GPU-hours), goodput, recovery times, money, notes; every figure marked an estimate."""
    attempts = cost["attempts"]
    lines = [
        f"Estimated cost of {run_uri}",
        f"(every figure is an estimate, in {cost['currency']}; prices: {prices_from})",
        "",
    ]
    header = ["phase (seconds)", *(f"attempt {a['attempt']}" for a in attempts), "total s", "GPU-hours"]
    rows = [header]
    for phase in PHASES:
        gpu_h = sum(a["seconds"][phase] * a["accelerators"] for a in attempts) / 3600
        rows.append(
            [
                PHASE_LABELS[phase],
                *(f"{a['seconds'][phase]:.1f}" for a in attempts),
                f"{cost['seconds'][phase]:.1f}",
                "-" if phase == "queued" else f"{gpu_h:.4f}",
            ]
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    for row in rows:
        lines.append(
            "  ".join(
                c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))
            )
        )
    lines.append("")
    sources = list(dict.fromkeys(a["price"]["source"] for a in attempts))
    for a in attempts:
        machine = a["instance_type"] or "unknown instance type"
        lines.append(
            f"attempt {a['attempt']}: {a['outcome']}, {a['capacity']} {machine}, {a['accelerators']} "
            f"accelerator(s), {a['billed_gpu_s'] / 3600:.4f} GPU-hours billed at "
            f"{money(a['price']['per_gpu_hour'])}/GPU-hour [{sources.index(a['price']['source']) + 1}]: "
            f"est. {money(a['cost'])} (on-demand {money(a['on_demand_cost'])})"
        )
    goodput = "n/a (nothing billed)" if cost["goodput"] is None else f"{cost['goodput']:.1%}"
    recovery = ", ".join(f"{s:.1f}s" for s in cost["recovery_s"]) or "none (no interruption)"
    share = f" ({cost['savings'] / cost['on_demand_cost']:.0%})" if cost["on_demand_cost"] else ""
    lines += [
        "",
        f"goodput (productive / billed GPU-hours)   {goodput}: "
        f"{cost['productive_gpu_hours']:.4f} / {cost['billed_gpu_hours']:.4f}",
        f"preemptions                               {cost['preemptions']}",
        f"recovery time (signal -> next first step) {recovery}",
        f"GPU-hours lost to interruptions           {cost['lost_gpu_hours']:.4f}",
        f"estimated cost                            {money(cost['cost'])}",
        f"on-demand equivalent                      {money(cost['on_demand_cost'])}",
        f"estimated spot savings                    {money(cost['savings'])}{share}",
    ]
    lines += ["", "price sources:", *(f"[{i}] {source}" for i, source in enumerate(sources, 1))]
    if cost["notes"]:
        lines += ["", "notes:", *(f"- {note}" for note in cost["notes"])]
    return "\n".join(lines)


def credential_line(exc: StorageError, what: str, aws_conn_id: str | None) -> str:
    """One line for a storage error; for a missing credential, which connection or variables
    to set."""
    if "credential" not in str(exc).lower():
        return f"could not read {what}: {exc}"
    conn = f"the Airflow connection {aws_conn_id!r} (where Airflow runs), or " if aws_conn_id else ""
    return (
        f"no credentials to read {what}: set {conn}AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
        "(or AWS_PROFILE), then try again"
    )


def run_cost(
    run_uri: str,
    prices_file: str | None,
    aws_conn_id: str | None = "aws_default",
    *,
    storage_root: str | None = None,
) -> int:
    """``cost``: print the bill of the run ``run_uri`` names; 1 (and why, in one line on stderr)
    when there is no run there, its ``job.json`` is damaged (:func:`trainops.shapes.check_job`
    names the field) or the prices are wrong; 2 when ``run_uri`` names no run or storage
    cannot be read for want of credentials."""
    try:
        root, _ = storage_root_choice(storage_root)
        listing = open_storage(root, outage_tolerance_s=10) if run_uri.strip() == LATEST else None
        ref = resolve(run_uri, root, listing)
    except (RunRefError, ValueError) as exc:
        print(f"cost: {exc}", file=sys.stderr)
        return 2
    except StorageError as exc:
        print(f"cost: {credential_line(exc, root, aws_conn_id)}", file=sys.stderr)
        return 2
    layout = RunLayout(ref.run_uri)
    # the fallback to boto3's chain is said here only when it fails (credential_line)
    logging.getLogger("trainops.hooks.storage").setLevel(logging.WARNING)
    store = storage_for(layout.run_uri, aws_conn_id)
    try:
        # every field the accounting and the bill read, so a damaged record is named, not a traceback
        job = load(store.get(layout.job), layout.job, lambda data, uri: check_job(data, uri, complete=True))
        stored = None if prices_file else stored_cost(job)
        if stored is not None:
            print(render(stored, layout.run_uri, "as priced when the run ended"))
            return 0
        text = None
        if prices_file:
            with open(prices_file, encoding="utf-8") as f:
                text = f.read()
        table, sources = load_prices(text, None)
        given = f"--prices {prices_file}"
        for capacities in table.values():  # the file's entries without a source of their own
            for price in capacities.values():
                if price["source"] == PARAMETER_SOURCE:
                    price["source"] = given
    except NotFound:
        print(
            f"cost: no job.json at {layout.job}; give a training run's prefix (its job_uri without /job.json)",
            file=sys.stderr,
        )
        return 1
    # a ShapeError is a ValueError: it names the file, the field and what was expected
    except (OSError, ValueError) as exc:
        print(f"cost: {exc}", file=sys.stderr)
        return 1
    except StorageError as exc:
        if "credential" in str(exc).lower():
            print(f"cost: {credential_line(exc, layout.job, aws_conn_id)}", file=sys.stderr)
            return 2
        print(f"cost: could not read {layout.job}: {exc}", file=sys.stderr)
        return 1
    cost = account(job, MetricsReader(store, layout.run_uri).records(), table, now=time.time())
    print(render(cost, layout.run_uri, sources.replace(PARAMETER_SOURCE, f"--prices {prices_file}")))
    return 0
