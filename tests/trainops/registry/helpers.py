"""Helpers shared by the registry tests: finished runs, gated candidates, storage on which a
rival writes the pointer at the worst moment, and faults aimed at one object through the
fault-injecting S3 proxy."""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable
from urllib.parse import urlsplit

import yaml

import tests.s3_faults
from trainer.contract import RunLayout, join, production_pointer
from trainer.storage import PreconditionFailed, StorageUnavailable
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


class LostAfterWrite:
    """Real storage on which the first write of ``pointer_uri`` takes effect, then ``rival``
    runs, then the write raises PreconditionFailed.

    That is what the storage client reports when a conditional write took effect, its reply was
    lost, and a rival wrote the object before the retry read it back (its write token is gone:
    docs/trainer.md, "What the token cannot tell"). The old client, which had no token, reported
    every lost reply of a compare-and-swap this way.
    """

    def __init__(self, storage, pointer_uri, rival=None):
        self._storage, self._pointer_uri, self._rival = storage, pointer_uri, rival
        self.lost = 0

    def put_json(self, uri, obj, **conditions):
        etag = self._storage.put_json(uri, obj, **conditions)
        if uri == self._pointer_uri and not self.lost:
            self.lost += 1
            if self._rival is not None:
                self._rival()
            raise PreconditionFailed(f"conditional write of {uri!r} lost: re-read it and retry")
        return etag

    def __getattr__(self, name):
        return getattr(self._storage, name)


class OutageAfterWrite:
    """Real storage on which the first write of ``pointer_uri`` ends in StorageUnavailable, as
    the client raises when an outage outlasts its tolerance: after the write took effect (its
    reply lost), or, with ``took_effect=False``, without it. With ``then_unreadable`` the
    pointer cannot be read afterwards either (the outage goes on)."""

    def __init__(self, storage, pointer_uri, *, took_effect=True, then_unreadable=False):
        self._storage, self._pointer_uri = storage, pointer_uri
        self._took_effect, self._then_unreadable = took_effect, then_unreadable
        self.failed = 0

    def _outage(self, uri):
        return StorageUnavailable(
            f"storage: PUT {uri} kept failing (test outage); the write may have taken effect"
        )

    def put_json(self, uri, obj, **conditions):
        if uri != self._pointer_uri or self.failed:
            return self._storage.put_json(uri, obj, **conditions)
        self.failed += 1
        if self._took_effect:
            self._storage.put_json(uri, obj, **conditions)
        raise self._outage(uri)

    def get_with_etag(self, uri):
        if uri == self._pointer_uri and self.failed and self._then_unreadable:
            raise self._outage(uri)
        return self._storage.get_with_etag(uri)

    def __getattr__(self, name):
        return getattr(self._storage, name)


LOG = logging.getLogger("tests.registry")
DATA_URI = "file:///datasets/demo-text/3f2a"
CHECKS = [
    {"name": "loss cap", "kind": "threshold", "metric": "eval_loss", "op": "<=", "value": 4.0},
    {"name": "no regression", "kind": "no_regression", "metric": "eval_loss", "tolerance": 0.0},
]
# A gate that asks for strict improvement on every slice: a candidate re-gated against itself
# (a model exactly as good) is rejected.
STRICT_CHECKS = [
    {
        "name": "better on every slice",
        "kind": "slices",
        "expectation": {
            "type": "expect_column_values_to_be_between",
            "kwargs": {"column": "regression_ratio", "max_value": 1.0, "strict_max": True},
        },
    }
]
SLICES = {"wiki": 1.0, "code": 1.25}  # each slice's loss, as a multiple of the overall loss


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
        slices = {
            value: {"eval_loss": loss * k, "perplexity": math.exp(loss * k), "tokens": tokens // len(SLICES)}
            for value, k in SLICES.items()
        }
        self.metrics = {
            "eval_loss": loss,
            "perplexity": math.exp(loss),
            "tokens": tokens,
            "slices": {"source": slices},
        }
        self.training = {
            "run_uri": self.run_uri,
            "export_uri": join(self.run_uri, "export"),
            "config_uri": join(self.run_uri, "config.yaml"),
            "steps": 40,
            "preemptions": 1,
        }
        self.dataset = {"dataset_name": "demo-text", "version": "3f2a", "uri": data_uri}


def gate_for(
    storage,
    cand: Candidate,
    production: Candidate | None,
    version: int | None,
    model: str = "demo-lm",
    checks: list[dict] = CHECKS,
) -> dict:
    """What EvaluationGateOperator returns (and writes to gate.json) for ``cand``."""
    definitions = validate_checks(checks)
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


class KeyFaults:
    """Faults on the PUTs of one object, through the fault proxy of ``tests/s3_faults.py``
    (which chooses faults by operation only, so on its own it cannot tell the pointer's PUT
    from a claim's).

    The n-th PUT of ``key`` (counted from 1, from now on) gets the proxy's action
    ``actions[n]``: ``"reset_after"`` loses its reply after S3 stored it. ``before[n]`` runs
    first, in the proxy, before that PUT is forwarded: a rival writing in the window between a
    lost reply and the client's retry. Every other request is left to the proxy's own faults.
    """

    def __init__(
        self,
        proxy,
        monkeypatch,
        key: str,
        *,
        actions: dict[int, str] | None = None,
        before: dict[int, Callable[[], object]] | None = None,
    ):
        self.key = key
        self.actions = dict(actions or {})
        self.before = dict(before or {})
        self.puts = 0
        self._lock = threading.Lock()
        self._current = threading.local()
        operation, decide = tests.s3_faults.operation, proxy._decide

        def operation_of(method, target, headers):
            # The proxy asks for the operation and then, in the same thread, decides on it.
            op = operation(method, target, headers)
            self._current.target = (op, urlsplit(target).path)
            return op

        def decide_for(op):
            seen, path = getattr(self._current, "target", (None, ""))
            if seen == op == "PUT" and path.endswith("/" + self.key):
                with self._lock:
                    self.puts += 1
                    n = self.puts
                if n in self.before:
                    self.before[n]()
                if n in self.actions:
                    return self.actions[n]
            return decide(op)

        monkeypatch.setattr(tests.s3_faults, "operation", operation_of)
        monkeypatch.setattr(proxy, "_decide", decide_for)
