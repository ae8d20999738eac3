"""``python -m trainops cost RUN [--prices FILE] [--json]``: what one training run cost, estimated.

RUN is the run's URI, its folder (a relative path too), ``<dag_id>/<run_id>`` or ``latest``
(:mod:`trainops.runs.refs`, under ``--storage-root``). Reads the run's ``job.json`` (``s3://``
through the Airflow connection ``aws_default`` when it is defined, else boto3's default
credentials, as the operator reads it); a missing credential is one line naming them, exit
status 2. A run that ended
since this version holds its bill (``"cost"``, priced when it ended); an older or still
running run, or ``--prices``, prices it now from ``job.json`` and the run's metrics. Its lost
time by cause (:mod:`trainops.cost.causes`) comes from the bill and ``job.json``'s attempt
records. :func:`render` and :func:`render_json` are pure functions of the bill and that view.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import TYPE_CHECKING

from trainer.contract import MetricsReader, RunLayout
from trainer.storage import NotFound, StorageError, open_storage
from trainops.cli.devenv import storage_root_choice
from trainops.cost.accounting import OPTIONAL_PHASES, PHASES, account, stored_cost
from trainops.cost.causes import CAUSE_LABELS, lost_by_cause
from trainops.cost.money import money
from trainops.cost.prices import PARAMETER_SOURCE, load_prices
from trainops.hooks.storage import storage_for
from trainops.runs.refs import LATEST, RunRefError, resolve
from trainops.shapes import check_job, load

if TYPE_CHECKING:
    from trainops.cost.accounting import RunCost
    from trainops.cost.causes import LostTime
    from trainops.recovery.record import JobRecord

PHASE_LABELS = {
    "queued": "queued (not billed)",
    "startup": "startup",
    "productive": "productive",
    "replayed": "replayed (steps lost)",
    "restart": "restart in place",
    "rollback": "rolled back (bad loss)",
    "checkpoint_stall": "checkpoint stall",
    "shutdown": "shutdown",
}


def _table(rows: list[list[str]]) -> list[str]:
    """Rows as aligned lines: the first column to the left, the others to the right."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in rows
    ]


def cause_lines(lost: LostTime) -> list[str]:
    """The run's lost time by cause: wall seconds, billed GPU-seconds and cost of each, the
    GPU-seconds waited for without paying, and the sum that gives the billed total."""
    rows = [["lost time by cause", "wall s", "GPU-s billed", "cost", "GPU-s not billed"]]
    for c in lost["causes"]:
        rows.append(
            [
                CAUSE_LABELS[c["cause"]],
                f"{c['seconds'] + c['unbilled_seconds']:.1f}",
                f"{c['gpu_s']:.1f}",
                money(c["cost"]),
                f"{c['unbilled_gpu_s']:.1f}",
            ]
        )
    rows.append(
        [
            "productive steps (not lost)",
            "",
            f"{lost['productive_gpu_s']:.1f}",
            money(lost["productive_cost"]),
            "",
        ]
    )
    lines = _table(rows)
    lines.append(
        f"productive + causes = billed: {lost['productive_gpu_s']:.1f} + {lost['unproductive_gpu_s']:.1f} = "
        f"{lost['billed_gpu_s']:.1f} GPU-s, {money(lost['productive_cost'])} + "
        f"{money(lost['unproductive_cost'])} = {money(lost['cost'])}"
    )
    return lines


def render(cost: RunCost, run_uri: str, prices_from: str, lost: LostTime | None = None) -> str:
    """The bill as a person reads it: phases per attempt (seconds) and in total (seconds and
    GPU-hours), lost time by cause (when ``lost`` is given), goodput, recovery times, money,
    notes; every figure marked an estimate."""
    attempts = cost["attempts"]
    lines = [
        f"Estimated cost of {run_uri}",
        f"(every figure is an estimate, in {cost['currency']}; prices: {prices_from})",
        "",
    ]
    header = ["phase (seconds)", *(f"attempt {a['attempt']}" for a in attempts), "total s", "GPU-hours"]
    rows = [header]
    for phase in PHASES:
        if phase in OPTIONAL_PHASES and not cost["seconds"].get(phase):
            continue  # no restart in place or rollback (a bill from before them has no such phase)
        gpu_h = sum(a["seconds"].get(phase, 0.0) * a["accelerators"] for a in attempts) / 3600
        rows.append(
            [
                PHASE_LABELS[phase],
                *(f"{a['seconds'].get(phase, 0.0):.1f}" for a in attempts),
                f"{cost['seconds'][phase]:.1f}",
                "-" if phase == "queued" else f"{gpu_h:.4f}",
            ]
        )
    lines += _table(rows)
    lines.append("")
    if lost is not None:
        lines += [*cause_lines(lost), ""]
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
    notes = [*cost["notes"], *(lost["notes"] if lost is not None else [])]
    if notes:
        lines += ["", "notes:", *(f"- {note}" for note in notes)]
    return "\n".join(lines)


def render_json(cost: RunCost, run_uri: str, prices_from: str, lost: LostTime) -> str:
    """The bill as JSON (``--json``): the ``RunCost`` (``trainops.cost/v1``) with ``run_uri``,
    ``prices_from`` and ``lost_by_cause`` (a ``LostTime``) beside its fields."""
    return json.dumps(
        {**cost, "run_uri": run_uri, "prices_from": prices_from, "lost_by_cause": lost}, indent=2
    )


def _print_bill(cost: RunCost, job: JobRecord, run_uri: str, prices_from: str, as_json: bool) -> None:
    lost = lost_by_cause(cost, job["attempts"])
    print(
        render_json(cost, run_uri, prices_from, lost) if as_json else render(cost, run_uri, prices_from, lost)
    )


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
    as_json: bool = False,
) -> int:
    """``cost``: print the bill of the run ``run_uri`` names (``as_json``: as JSON, with its
    lost time by cause); 1 (and why, in one line on stderr)
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
            _print_bill(stored, job, layout.run_uri, "as priced when the run ended", as_json)
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
    _print_bill(
        cost, job, layout.run_uri, sources.replace(PARAMETER_SOURCE, f"--prices {prices_file}"), as_json
    )
    return 0
