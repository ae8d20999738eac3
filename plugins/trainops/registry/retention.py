"""Retention: which checkpoints of finished training runs to delete, and deleting them.

Checkpoints hold the model, the optimizer state and the data cursor: three to four times
the exported weights, for every kept step of every run. Once the gate has decided on a
run, they are only needed to continue training from it. The policy, opt-in through
``PromoteModelOperator(retention={"keep_last_runs": N})``:

- It looks at the runs of the same DAG (``runs/<dag_id>/``) that the gate decided for the
  same model (they have ``eval/gate.json``). Runs still training have none and are never
  touched.
- The ``N`` most recently decided runs keep every checkpoint.
- Older runs are pruned. A run that was approved, or that any model version came from
  (every version with a card, which includes every production and rollback target in the
  pointer's history), keeps its final checkpoint: the newest committed step. A rejected
  run loses all its checkpoints (and ``checkpoints/latest.json``).
- Exports (``<run>/export``), evaluation results, metrics, attempt records and everything
  under ``models/`` are never deleted; so are unknown files under ``checkpoints/``.
- The pointer is read just before anything is deleted (:func:`protected_runs`); when it cannot
  be read, pruning stops with nothing deleted.

``N = 0`` prunes every decided run right away, this one included. A checkpoint is deleted
``_COMMITTED`` first, so a reader never trusts a half-deleted one.

:func:`plan_pruning` is the pure decision; :func:`scan_runs`, :func:`protected_runs` and
:func:`apply_plan` are the storage I/O around it.
"""

from __future__ import annotations

import re

from trainer.contract import RunLayout, join, model_prefix, production_pointer
from trainer.storage import NotFound
from trainops.registry.pointer import read_pointer

__all__ = [
    "apply_plan",
    "check_policy",
    "plan_pruning",
    "protected_runs",
    "runs_scope",
    "scan_runs",
]

_POLICY_KEYS = ("keep_last_runs",)
_GATE_SUFFIX = "/eval/gate.json"
_STEP = re.compile(r"/checkpoints/step_(\d+)(/.*)?$")


def check_policy(policy: object) -> dict | None:
    """None (no pruning) or ``{"keep_last_runs": N}`` with an integer N >= 0.

    Raises ValueError naming the bad key or value; cheap, so operators call it at DAG parse.
    """
    if policy is None:
        return None
    if not isinstance(policy, dict):
        raise ValueError(
            f"retention must be None or a dict such as {{'keep_last_runs': 3}}, "
            f"got {type(policy).__name__} {policy!r}"
        )
    unknown = sorted(set(policy) - set(_POLICY_KEYS))
    if unknown:
        raise ValueError(
            f"retention has unknown key {unknown[0]!r}; the only key is "
            f"'keep_last_runs' (how many recent finished runs keep every checkpoint)"
        )
    keep = policy.get("keep_last_runs")
    if not isinstance(keep, int) or isinstance(keep, bool) or keep < 0:
        raise ValueError(f"retention keep_last_runs must be an integer >= 0, got {keep!r}")
    return {"keep_last_runs": keep}


# ------------------------------------------------------------------------- pure decision


def plan_pruning(runs: list[dict], *, protected: set[str], keep_last_runs: int) -> list[dict]:
    """The checkpoint steps to delete, as ``[{"run_uri", "step", "why"}]``.

    :param runs: finished runs, each ``{"run_uri", "decided_at", "approved", "steps",
        "final_step"}``: ``steps`` every ``checkpoints/step_<N>`` folder, ``final_step``
        the newest committed one (None if none is committed).
    :param protected: run URIs that a model version came from; their final checkpoint is
        kept whatever their gate said.
    :param keep_last_runs: how many of the most recently decided runs keep everything.
    """
    ordered = sorted(runs, key=lambda r: (r.get("decided_at") or "", r["run_uri"]), reverse=True)
    out = []
    for run in ordered[keep_last_runs:]:
        promoted = run["run_uri"] in protected
        keep_final = promoted or bool(run.get("approved"))
        final = run.get("final_step")
        for step in sorted(set(run.get("steps") or [])):
            if keep_final and step == final:
                continue
            if keep_final:
                why = "intermediate checkpoint of a " + ("promoted" if promoted else "approved") + " run"
            else:
                why = "checkpoint of a rejected run"
            out.append({"run_uri": run["run_uri"], "step": step, "why": why})
    return out


# ------------------------------------------------------------------------- storage I/O


def runs_scope(run_uri: str) -> str:
    """``<root>/runs/<dag_id>`` for a run at ``<root>/runs/<dag_id>/<run_id>/<task_id>``."""
    return run_uri.rstrip("/").rsplit("/", 2)[0]


def scan_runs(storage, scope_uri: str, model: str) -> list[dict]:
    """The runs under ``scope_uri`` that the gate decided for ``model``, with their steps."""
    objects = storage.list(scope_uri)
    gates = [uri[: -len(_GATE_SUFFIX)] for uri in objects if uri.endswith(_GATE_SUFFIX)]
    runs = []
    for run_uri in sorted(gates):
        try:
            gate = storage.get_json(run_uri + _GATE_SUFFIX)
        except Exception:
            continue
        if not isinstance(gate, dict) or gate.get("model_name") != model:
            continue
        steps, committed = set(), set()
        prefix = join(run_uri, "checkpoints") + "/"
        for uri in objects:
            if not uri.startswith(prefix):
                continue
            match = _STEP.search(uri[len(run_uri) :])
            if match:
                steps.add(int(match.group(1)))
                if match.group(2) == "/_COMMITTED":
                    committed.add(int(match.group(1)))
        runs.append(
            {
                "run_uri": run_uri,
                "decided_at": gate.get("decided_at"),
                "approved": bool(gate.get("approved")),
                "steps": sorted(steps),
                "final_step": max(committed) if committed else None,
            }
        )
    return runs


def protected_runs(storage, root: str, model: str) -> set[str]:
    """Run URIs that a version of ``model`` came from: the pointer history's and every card's.

    Read just before anything is deleted. A pointer that cannot be read (storage unavailable,
    malformed, or another model's) raises rather than counting as no pointer: what it names must not be pruned for
    want of reading it. A card that is gone by the time it is read (its version abandoned
    meanwhile) protects nothing.
    """
    out: set[str] = set()
    pointer = read_pointer(storage, production_pointer(root, model), model=model)[0]
    for entry in pointer["history"] if pointer else []:
        run_uri = entry.get("run_uri")
        if run_uri:
            out.add(run_uri)
    for uri in storage.list(join(model_prefix(root, model), "versions")):
        if uri.endswith("/card.json"):
            try:
                card = storage.get_json(uri)
            except NotFound:
                continue
            if isinstance(card, dict) and card.get("run_uri"):
                out.add(card["run_uri"])
    return out


def apply_plan(storage, plan: list[dict], runs: list[dict], protected: set[str]) -> list[str]:
    """Delete the planned checkpoints; return their prefixes.

    Refuses (ValueError) to delete the final checkpoint of a protected run, whatever the
    plan says: that guard does not depend on the policy being right.
    """
    final = {r["run_uri"]: r.get("final_step") for r in runs}
    for item in plan:
        if item["run_uri"] in protected and item["step"] == final.get(item["run_uri"]):
            raise ValueError(
                f"retention planned to delete the final checkpoint (step "
                f"{item['step']}) of {item['run_uri']}, which a model version came "
                "from; nothing was deleted"
            )
    deleted = []
    for item in plan:
        layout = RunLayout(item["run_uri"])
        storage.delete(layout.committed_marker(item["step"]))
        storage.delete_prefix(layout.checkpoint(item["step"]))
        deleted.append(layout.checkpoint(item["step"]))
    doomed: dict[str, set[int]] = {}
    for item in plan:
        doomed.setdefault(item["run_uri"], set()).add(item["step"])
    for run in runs:
        if run["steps"] and set(run["steps"]) <= doomed.get(run["run_uri"], set()):
            storage.delete(RunLayout(run["run_uri"]).latest)
    return deleted
