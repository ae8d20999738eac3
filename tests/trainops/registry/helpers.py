"""Helpers shared by the registry tests: finished runs, gated candidates, and storage on
which a rival writes the pointer at the worst moment."""

from __future__ import annotations

import logging
import math

import yaml

from trainer.contract import RunLayout, join, production_pointer
from trainops.gate.checks import decide, validate_checks
from trainops.registry.card import build_card
from trainops.registry.promotion import promote
from trainops.registry.regate import make_regate


def make_run(storage, root: str, name: str = "run-1", *, small: bool = False) -> str:
    """A finished training run: an export and the resolved config."""
    run_uri = join(root, "runs", "retrain", name, "train")
    storage.put(join(run_uri, "export", "model.safetensors"), f"weights of {name}".encode())
    if not small:
        storage.put(join(run_uri, "export", "tokenizer", "vocab.json"), b'{"a": 1}')
    storage.put(join(run_uri, "config.yaml"), f"model: tiny\nrun: {name}\n".encode())
    return run_uri


def card_for(run_uri: str) -> dict:
    return {
        "run_uri": run_uri,
        "config_uri": join(run_uri, "config.yaml"),
        "dataset": {"dataset_name": "demo", "version": "v3", "uri": "file:///d"},
        "metrics": {"candidate": {"eval_loss": 3.0}},
        "steps": 100,
        "preemptions_survived": 2,
    }


def do_promote(storage, root, run_uri, expected, name="demo-lm"):
    return promote(
        storage,
        root,
        name,
        export_uri=join(run_uri, "export"),
        card=card_for(run_uri),
        expected_production_version=expected,
    )


def promote_runs(storage, root: str, count: int, name: str = "demo-lm") -> list[str]:
    """Promote ``count`` runs one after the other: production ends at v``count``."""
    runs = []
    for n in range(1, count + 1):
        run_uri = join(root, "runs", "retrain", f"run-{n}", "train")
        storage.put(join(run_uri, "export", "model.safetensors"), f"weights {n}".encode())
        promote(
            storage,
            root,
            name,
            export_uri=join(run_uri, "export"),
            card={"run_uri": run_uri},
            expected_production_version=n - 1 if n > 1 else None,
        )
        runs.append(run_uri)
    return runs


class BeforePointerWrite:
    """Real storage that runs ``action`` once, just before its first write of ``pointer_uri``.

    Promotion and rollback read the pointer and then write it; running code in between is how
    these tests put a rival's write (or a barrier) exactly into that window.
    """

    def __init__(self, storage, pointer_uri, action):
        self._storage, self._pointer_uri, self._action = storage, pointer_uri, action

    def _maybe_run(self, uri):
        if self._action and uri == self._pointer_uri:
            action, self._action = self._action, None
            action()

    def put(self, uri, data, **conditions):
        self._maybe_run(uri)
        return self._storage.put(uri, data, **conditions)

    def put_json(self, uri, obj, **conditions):
        self._maybe_run(uri)
        return self._storage.put_json(uri, obj, **conditions)

    def __getattr__(self, name):
        return getattr(self._storage, name)


LOG = logging.getLogger("tests.registry")
DATA_URI = "file:///datasets/demo-text/3f2a"
CHECKS = [
    {"name": "loss cap", "kind": "threshold", "metric": "eval_loss", "op": "<=", "value": 4.0},
    {"name": "no regression", "kind": "no_regression", "metric": "eval_loss", "tolerance": 0.0},
]


class Candidate:
    """A finished, evaluated training run: export, resolved config and upstream results."""

    def __init__(
        self, storage, root: str, name: str, loss: float, *, data_uri: str = DATA_URI, tokens: int = 4096
    ):
        self.run_uri = join(root, "runs", "retrain", name, "train")
        storage.put(join(self.run_uri, "export", "model.safetensors"), f"weights {name}".encode())
        config = {
            "run_uri": self.run_uri,
            "data_uri": data_uri,
            "train": {"seq_len": 64},
            "eval": {"batch_size": 8, "max_batches": 0},
        }
        storage.put(join(self.run_uri, "config.yaml"), yaml.safe_dump(config).encode())
        self.loss = loss
        self.metrics = {"eval_loss": loss, "perplexity": math.exp(loss), "tokens": tokens, "slices": {}}
        self.training = {
            "run_uri": self.run_uri,
            "export_uri": join(self.run_uri, "export"),
            "config_uri": join(self.run_uri, "config.yaml"),
            "steps": 40,
            "preemptions": 1,
        }
        self.dataset = {"dataset_name": "demo-text", "version": "3f2a", "uri": data_uri}


def gate_for(
    storage, cand: Candidate, production: Candidate | None, version: int | None, model: str = "demo-lm"
) -> dict:
    """What EvaluationGateOperator returns (and writes to gate.json) for ``cand``."""
    definitions = validate_checks(CHECKS)
    decision = decide(definitions, cand.metrics, production and production.metrics, version)
    gate_uri = RunLayout(cand.run_uri).eval_gate
    storage.put_json(gate_uri, {**decision, "model_name": model, "check_definitions": definitions})
    return {
        **decision,
        "gate_uri": gate_uri,
        "check_definitions": definitions,
        "model_name": model,
        "run_uri": cand.run_uri,
    }


def promote_candidate(storage, root: str, cand: Candidate, gate: dict, model: str = "demo-lm"):
    card = build_card(
        storage,
        gate=gate,
        training=cand.training,
        dataset=cand.dataset,
        evaluation={"candidate": cand.metrics},
    )
    regate = make_regate(
        storage, root, model, gate=gate, candidate=cand.metrics, basis=card["eval_basis"], log=LOG
    )
    return promote(
        storage,
        root,
        model,
        export_uri=cand.training["export_uri"],
        card=card,
        expected_production_version=gate["production_version"],
        regate=regate,
    )


def two_candidates_gated_against_v1(storage, root, mine_loss, rival_loss, **mine_kwargs):
    base = Candidate(storage, root, "base", 3.0)
    promote_candidate(storage, root, base, gate_for(storage, base, None, None))
    mine = Candidate(storage, root, "mine", mine_loss, **mine_kwargs)
    rival = Candidate(storage, root, "rival", rival_loss)
    return base, mine, rival, gate_for(storage, mine, base, 1), gate_for(storage, rival, base, 1)


def rival_first(storage, root, rival, rival_gate):
    """Storage on which the rival promotes just before this promotion writes the pointer."""
    return BeforePointerWrite(
        storage,
        production_pointer(root, "demo-lm"),
        lambda: promote_candidate(storage, root, rival, rival_gate),
    )
