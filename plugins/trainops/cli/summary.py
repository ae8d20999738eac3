"""The demo's closing summary: what a person wants to know after a retraining run.

``collect`` reads storage (I/O); ``render`` is a pure function of what it collected. The cost
lines come from the training task's result (``cost``, the run's bill as ``job.json`` records
it, see :mod:`trainops.cost.accounting`), written with the one money rule
(:func:`trainops.cost.money.money`) and labelled estimates.

Data that staging rejected is named expectation by expectation, from the validation report
(``validation.json``) whose URI the stage task pushed (``validation_uri``). The summary ends
pointing onward: the run's report page in the Airflow that ``make airflow`` starts, and the
commands that look further.
"""

from __future__ import annotations

import json

from trainer.contract import RunLayout, production_pointer
from trainer.storage import NotFound, StorageError
from trainops.cost.money import money
from trainops.reports.urls import report_url as page_url
from trainops.shapes import ShapeError, check_pointer, load
from trainops.staging.validation import failure_lines

# Where ``make airflow`` serves the report app: trainops.links.report_url and home_url with this
# base URL (not imported: trainops.links imports Airflow, which this command line must not load).
DEMO_AIRFLOW_URL = "http://localhost:8080"
STAGING_REJECTED = (
    "dataset          REJECTED by staging (the stage task's log lists the failed "
    "expectations); nothing was trained or written"
)


def collect(
    store,
    root: str,
    results: dict,
    model_name: str,
    run_note: str | None = None,
    validation_uri: str | None = None,
) -> dict:
    """Gather the facts from the task results (XCom dicts), storage and the DAG run's note
    (what the gate or promote wrote there when nothing was promoted). A production pointer
    that cannot be read, or is damaged (:func:`trainops.shapes.check_pointer`), is None, and
    ``production_problem`` says why.

    :param validation_uri: the validation report the stage task pushed (its XCom
        ``trainops_validation_report``); read when staging rejected the data (no ``stage``
        result), so the summary names the failed expectations.
    """
    facts = {
        "model_name": model_name,
        "root": root,
        **{k: results.get(k) for k in ("stage", "train", "evaluate", "gate", "promote")},
        "evaluate_checkpoints": results.get("evaluate_checkpoints"),  # demo --best-checkpoint's
        "run_note": run_note,
        "production": None,
        "production_problem": None,
        "validation_uri": validation_uri,
        "validation": None,
    }
    if validation_uri and not results.get("stage"):
        facts["validation"] = _report(store, validation_uri)
    uri = production_pointer(root, model_name)
    try:
        facts["production"] = load(store.get(uri), uri, check_pointer)
    except NotFound:
        pass
    except (ShapeError, StorageError) as exc:  # the summary still says what the run did
        facts["production_problem"] = (
            str(exc) if isinstance(exc, ShapeError) else f"could not read {uri}: {exc}"
        )
    return facts


def _report(store, uri: str) -> dict | None:
    """A validation report, or None when it cannot be read (the summary falls back to a line)."""
    try:
        report = json.loads(store.get(uri))
    except (NotFound, StorageError, ValueError):
        return None
    return report if isinstance(report, dict) and isinstance(report.get("failed"), list) else None


def _cost_lines(cost: object) -> list[str]:
    """Goodput, recovery time, GPU-hours and the estimated cost of the training run."""
    if not isinstance(cost, dict) or not isinstance(cost.get("billed_gpu_hours"), int | float):
        return ["cost             not recorded (the train task's log says why); no goodput either"]
    goodput = cost.get("goodput")
    recovery = [f"{s:.1f} s" for s in cost.get("recovery_s") or [] if isinstance(s, int | float)]
    on_demand, savings = cost.get("on_demand_cost"), cost.get("savings")
    share = (
        f" ({savings / on_demand:.0%})"
        if isinstance(savings, int | float) and isinstance(on_demand, int | float) and on_demand
        else ""
    )
    return [
        f"goodput          {'-' if not isinstance(goodput, int | float) else f'{goodput:.1%}'} "
        f"(productive / billed GPU time); recovery {', '.join(recovery) or 'none (no interruption)'} "
        "(signal to the next attempt's first step)",
        f"GPU-hours        {cost['billed_gpu_hours']:.4f} billed, {cost.get('productive_gpu_hours', 0):.4f} "
        f"productive, {cost.get('lost_gpu_hours', 0):.4f} lost to interruptions",
        f"cost (estimate)  {money(cost.get('cost'))} spot, {money(on_demand)} on-demand equivalent: "
        f"spot saved {money(savings)}{share}",
    ]


def _evaluation_line(ev: dict) -> str:
    """The candidate's evaluation in a line: its task's own figures, and production's loss."""
    cand = ev["candidate"]
    if cand.get("accuracy") is not None:  # a classifier: its records and labels
        line = (
            f"eval loss        {cand['eval_loss']:.4f} (accuracy {cand['accuracy']:.1%}, macro F1 "
            f"{cand['f1_macro']:.3f}, {cand.get('records', cand['tokens']):,} records)"
        )
    elif cand.get("exact_match") is not None:  # sft: its greedy answers too
        line = (
            f"eval loss        {cand['eval_loss']:.4f} (exact match {cand['exact_match']:.1%}, token F1 "
            f"{cand['token_f1']:.3f} over {cand['answers']:,} greedy answers)"
        )
    else:
        line = f"eval loss        {cand['eval_loss']:.4f} (perplexity {cand['perplexity']:.2f}, {cand['tokens']:,} tokens)"
    if ev.get("production"):
        return line + f"; production v{ev['production_version']}: {ev['production']['eval_loss']:.4f}"
    return line + "; no production model yet"


def render(facts: dict) -> str:
    stage, train = facts.get("stage") or {}, facts.get("train") or {}
    ev, gate, promote = facts.get("evaluate") or {}, facts.get("gate") or {}, facts.get("promote")
    lines = ["", "trainops demo summary", "---------------------"]
    rejected = failure_lines(facts.get("validation") or {}) if not stage else []
    if not stage:
        if rejected:
            lines.append("dataset          REJECTED by staging; nothing was trained or written")
            lines += rejected
        else:
            lines.append(STAGING_REJECTED)
    if stage:
        how = "reused (unchanged input)" if stage.get("reused") else "staged and validated"
        lines.append(
            f"dataset          {stage['dataset_name']} version {stage['version']}: "
            f"{stage['rows']:,} rows, {stage['train_tokens']:,} train / "
            f"{stage['eval_tokens']:,} eval tokens, {how}"
        )
    if train:
        lines.append(
            f"training         {train['steps']} steps in {train['attempts']} attempt(s); "
            f"preemptions survived {train['preemptions']}, "
            + (f"restarts in place {train['restarts_in_place']}, " if train.get("restarts_in_place") else "")
            + f"steps lost {train['steps_lost']}"
        )
        if train.get("final_loss") is not None:
            lines.append(f"final train loss {train['final_loss']:.4f}")
        lines += _cost_lines(train.get("cost"))
    pick = (facts.get("evaluate_checkpoints") or {}).get("checkpoint_pick")
    if pick:
        lines.append(f"checkpoint       picked {pick['why']}")
    if ev:
        lines.append(_evaluation_line(ev))
    if gate:
        verdicts = ", ".join(
            f"{c['name']}: {'pass' if c['passed'] else 'FAIL'}" for c in gate.get("checks", [])
        )
        lines.append(f"gate             {'approved' if gate.get('approved') else 'REJECTED'} ({verdicts})")
    if promote:
        prev = promote.get("previous_version")
        lines.append(
            f"promoted         {facts['model_name']} v{promote['version']}"
            + (f" (was v{prev})" if prev else " (first production version)")
        )
    elif gate:
        # The run's note says why (rejected, or identical to production): the first line of its
        # last part (the gate's approval may come before promote's "NOT PROMOTED").
        parts = [p.strip() for p in (facts.get("run_note") or "").split("\n\n") if p.strip()]
        said = [p for p in parts if p.startswith(("NOT PROMOTED", "REJECTED"))] or parts[-1:]
        why = said[-1].splitlines()[0] if said else "the gate rejected the candidate"
        lines.append(f"promoted         nothing: {why}")
    artifacts = []
    if stage:
        artifacts.append(f"  dataset        {stage['uri']}")
    if train:
        artifacts.append(f"  run            {train['run_uri']}")
    if facts.get("production"):
        artifacts.append(f"  production     {facts['production'].get('uri') or '-'}")
    elif facts.get("production_problem"):
        artifacts.append(f"  production     unreadable: {facts['production_problem']}")
    lines += (["artifacts", *artifacts] if artifacts else []) + onward_lines(facts)
    return "\n".join(lines) + "\n"


def report_url(uri: str) -> str:
    """The report app's page of the stored report ``uri`` in the Airflow of ``make airflow``."""
    return page_url(uri, DEMO_AIRFLOW_URL)


def _report_of(facts: dict) -> tuple[str, str] | None:
    """The page that says most about the run: the training run's report, else the validation
    report of the data (staged, or rejected); None when there is neither."""
    train, stage = facts.get("train") or {}, facts.get("stage") or {}
    if train.get("run_uri"):
        return "run report", RunLayout(train["run_uri"]).job
    if stage.get("validation_uri"):
        return "validation", stage["validation_uri"]
    if facts.get("validation_uri"):
        return "validation", facts["validation_uri"]
    return None


def onward_lines(facts: dict) -> list[str]:
    """The summary's last lines: where the run's report is (once ``make airflow`` runs) and the
    commands that look further."""
    lines = ["reports          make airflow, then open in a browser (log in as admin)"]
    found = _report_of(facts)
    if found:
        lines.append(f"  {found[0]:<15}{report_url(found[1])}")
    lines.append(f"  {'home':<15}{DEMO_AIRFLOW_URL}/trainops/")
    trained = bool((facts.get("train") or {}).get("run_uri"))
    # `latest` is the newest training run: after staging rejected the data, an earlier run's
    commands = (
        [
            ("python -m trainops status latest", "the newest run's state"),
            ("python -m trainops report latest", "its report's URL (--open opens it)"),
        ]
        if trained
        else [("python -m trainops runs", "the training runs so far and their outcomes")]
    )
    commands.append(
        (f"python -m trainops models {facts['model_name']}", "production and its history: who and why")
    )
    width = max(len(command) for command, _ in commands)
    lines.append("look further")
    lines += [f"  {command:<{width}}  {what}" for command, what in commands]
    return lines
