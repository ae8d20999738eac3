"""The demo's closing summary: what a person wants to know after a retraining run.

``collect`` reads storage (I/O); ``render`` is a pure function of what it collected.
"""

from __future__ import annotations


def collect(store, root: str, results: dict, model_name: str) -> dict:
    """Gather the facts from the task results (XCom dicts) and storage."""
    from trainer.contract import production_pointer
    from trainer.storage import NotFound

    facts = {
        "model_name": model_name,
        "root": root,
        **{k: results.get(k) for k in ("stage", "train", "evaluate", "gate", "promote")},
    }
    try:
        facts["production"] = store.get_json(production_pointer(root, model_name))
    except NotFound:
        facts["production"] = None
    return facts


def render(facts: dict) -> str:
    stage, train = facts.get("stage") or {}, facts.get("train") or {}
    ev, gate, promote = facts.get("evaluate") or {}, facts.get("gate") or {}, facts.get("promote")
    lines = ["", "trainops demo summary", "---------------------"]
    if not stage:
        lines.append(
            "dataset          REJECTED by staging (the stage task's log lists the failed "
            "expectations); nothing was trained or written"
        )
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
            f"preemptions survived {train['preemptions']}, steps lost {train['steps_lost']}"
        )
        if train.get("final_loss") is not None:
            lines.append(f"final train loss {train['final_loss']:.4f}")
    if ev:
        cand = ev["candidate"]
        line = f"eval loss        {cand['eval_loss']:.4f} (perplexity {cand['perplexity']:.2f}, {cand['tokens']:,} tokens)"
        if ev.get("production"):
            line += f"; production v{ev['production_version']}: {ev['production']['eval_loss']:.4f}"
        else:
            line += "; no production model yet"
        lines.append(line)
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
        lines.append("promoted         nothing: the gate rejected the candidate")
    lines.append("artifacts")
    if stage:
        lines.append(f"  dataset        {stage['uri']}")
    if train:
        lines.append(f"  run            {train['run_uri']}")
    if facts.get("production"):
        lines.append(f"  production     {facts['production']['uri']}")
    return "\n".join(lines) + "\n"
