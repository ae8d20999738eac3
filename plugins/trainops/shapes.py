"""The shapes of the stored records that the report pages and ``python -m trainops`` read:
a run's ``job.json``, a model version's ``card.json``, a model's production pointer
(``production.json``) and a dataset version's ``manifest.json``.

A record in storage may be damaged (cut short, edited by hand) or foreign (another tool's
file, another version's). Each kind has one check here, which every page and command calls
before it reads the record: :func:`check_job`, :func:`check_card`, :func:`check_pointer`,
:func:`check_manifest` (:func:`check_for` picks one by the object's path). A record that is
not as expected raises :class:`ShapeError`, which names the file, the field and what was
expected and found, in one line::

    s3://b/runs/d/r/train/job.json: field 'attempts[0].steps_lost' should be a whole number,
    got the text "x"; the run's record is damaged: restore it, or move it aside to start the
    run's bookkeeping afresh

A check looks at the types of the fields its readers use, at any depth; a field an older
record lacks is no error (pages show it as missing), except where a command needs it:
``check_job(..., complete=True)`` asks for every field the cost accounting reads. Fields the
checks do not know are left alone (a newer writer's). The checks are pure; :func:`load` parses
the bytes first, so a truncated file gets the same kind of message.

The writers' own types are the reference: :class:`trainops.recovery.record.JobRecord` (its
required keys are :func:`trainops.recovery.record.as_job_record`'s), the cost accounting's
``RunCost``, :class:`trainops.registry.pointer.Pointer`, the card that
:mod:`trainops.registry.card` and promotion write, and :mod:`trainops.staging.manifest`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, cast

from trainer.contract import MANIFEST_FORMAT, SPLITS
from trainops.cost.accounting import COST_FORMAT, OPTIONAL_PHASES, PHASES, AttemptCost, RunCost, Span
from trainops.cost.prices import Priced
from trainops.recovery.record import AttemptEntry, JobRecord, as_job_record
from trainops.registry.errors import MalformedPointer
from trainops.registry.pointer import Pointer, parse_pointer

__all__ = [
    "ShapeError",
    "check_card",
    "check_for",
    "check_job",
    "check_manifest",
    "check_pointer",
    "load",
]

# What to do about a damaged record of each kind (by its file name).
_ADVICE = {
    "job.json": "the run's record is damaged: restore it, or move it aside to start the run's bookkeeping afresh",
    "card.json": "the version's card is damaged: restore it from a copy of the version",
    "production.json": "the production pointer is damaged: restore it from its history or delete it",
    "manifest.json": "the dataset version's manifest is damaged: stage the dataset again",
}
# What each kind is, for a message about a file that holds another JSON value.
_WHAT = {
    "job.json": "a training run's record",
    "card.json": "a model version's card",
    "production.json": "a production pointer",
    "manifest.json": "a dataset manifest",
}
_LONGEST_TEXT = 60  # characters of a wrong value quoted in a message


class ShapeError(ValueError):
    """A stored record that is not the shape its readers expect.

    :param uri: the record's storage URI.
    :param field: the field, as a path (``attempts[0].steps_lost``); None for the whole record.
    :param expected: what the field should be (``a whole number``).
    :param got: what it is (``the text "x"``, ``nothing (the field is missing)``).
    :param kind: the record's kind (``job.json``), for what to do about it; by default the
        name of the file at ``uri``.
    """

    def __init__(self, uri: str, field: str | None, expected: str, got: str, kind: str | None = None):
        self.uri, self.field, self.expected, self.got = uri, field, expected, got
        advice = _ADVICE.get(kind or uri.rstrip("/").rsplit("/", 1)[-1], "restore it or delete it")
        if field is None and expected == "valid JSON":
            what = f"{uri} is not valid JSON ({got}), perhaps cut short"
        elif field is None:
            what = f"{uri} should hold {expected}, got {got}"
        else:
            what = f"{uri}: field '{field}' should be {expected}, got {got}"
        super().__init__(f"{what}; {advice}")


# ----------------------------------------------------------------------------- the shapes


@dataclass(frozen=True)
class _Leaf:
    what: str
    fits: Callable[[object], bool]


@dataclass(frozen=True)
class _Obj:
    """An object with known ``fields`` (others are left alone); ``required`` must be there."""

    fields: Mapping[str, _Spec]
    required: frozenset[str] = frozenset()


@dataclass(frozen=True)
class _List:
    item: _Spec


@dataclass(frozen=True)
class _Map:
    """An object whose every value is ``value`` (names of phases, slices, splits), ``required``
    among its keys."""

    value: _Spec
    required: tuple[str, ...] = ()


@dataclass(frozen=True)
class _Null:
    """``spec``, or null."""

    spec: _Spec


_Spec = _Leaf | _Obj | _List | _Map | _Null


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: object) -> bool:
    # NaN and infinities are numbers: JSON as Python writes it holds them, and pages show them.
    return isinstance(value, int | float) and not isinstance(value, bool)


STR = _Leaf("a string", lambda v: isinstance(v, str))
INT = _Leaf("a whole number", _whole)
NUM = _Leaf("a number", _number)
BOOL = _Leaf("true or false", lambda v: isinstance(v, bool))
ANY_OBJ = _Obj({})
ANY_LIST = _List(_Leaf("any value", lambda v: True))


def _describe(spec: _Spec) -> str:
    if isinstance(spec, _Leaf):
        return spec.what
    if isinstance(spec, _Null):
        return f"{_describe(spec.spec)} or null"
    return "a list" if isinstance(spec, _List) else "an object"


_MISSING = object()


def _got(value: object) -> str:
    """A wrong value as a message quotes it: its kind, and a short text or number."""
    if value is _MISSING:
        return "nothing (the field is missing)"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and not math.isfinite(value):
        return str(value).replace("nan", "NaN").replace("inf", "Infinity")
    if isinstance(value, int | float):
        return f"the number {value!r}"
    if isinstance(value, str):
        text = json.dumps(value, ensure_ascii=False)
        return "the text " + (text if len(text) <= _LONGEST_TEXT else text[: _LONGEST_TEXT - 4] + '..."')
    if isinstance(value, list):
        return f"a list of {len(value)} item(s)"
    if isinstance(value, dict):
        return f"an object with {len(value)} field(s)"
    return type(value).__name__


def _at(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def _problem(value: object, spec: _Spec, path: str) -> tuple[str, _Spec, object] | None:
    """The first field of ``value`` (at ``path``) that does not fit ``spec``: ``(field, its
    spec, its value)``; None when all fit."""
    if isinstance(spec, _Null):
        found = None if value is None else _problem(value, spec.spec, path)
        # the field itself is wrong: say that null would do too
        return (path, spec, value) if found is not None and found[0] == path else found
    if isinstance(spec, _Leaf):
        return None if spec.fits(value) else (path, spec, value)
    if isinstance(spec, _List):
        return _list_problem(value, spec, path)
    if not isinstance(value, dict):
        return path, spec, value
    if isinstance(spec, _Map):
        return _map_problem(value, spec, path)
    return _obj_problem(value, spec, path)


def _list_problem(value: object, spec: _List, path: str) -> tuple[str, _Spec, object] | None:
    if not isinstance(value, list):
        return path, spec, value
    for i, item in enumerate(value):
        found = _problem(item, spec.item, _at(path, i))
        if found:
            return found
    return None


def _map_problem(value: dict, spec: _Map, path: str) -> tuple[str, _Spec, object] | None:
    for key in spec.required:
        if key not in value:
            return _at(path, key), spec.value, _MISSING
    for key, item in value.items():
        found = _problem(item, spec.value, _at(path, str(key)))
        if found:
            return found
    return None


def _obj_problem(value: dict, spec: _Obj, path: str) -> tuple[str, _Spec, object] | None:
    for key in sorted(spec.required):
        if key not in value:
            return _at(path, key), spec.fields.get(key, _Leaf("present", lambda v: True)), _MISSING
    for key, field in spec.fields.items():
        if key in value:
            found = _problem(value[key], field, _at(path, key))
            if found:
                return found
    return None


def _check(data: object, uri: str, spec: _Obj, kind: str) -> dict[str, Any]:
    """``data`` when it fits ``spec``; else ShapeError naming the first field that does not."""
    if not isinstance(data, dict):
        raise ShapeError(uri, None, f"a JSON object ({_WHAT[kind]})", _got(data), kind)
    _raise_problem(uri, _problem(data, spec, ""), kind)
    return data


def _raise_problem(uri: str, found: tuple[str, _Spec, object] | None, kind: str) -> None:
    if found is not None:
        field, expected, got = found
        raise ShapeError(uri, field, _describe(expected), _got(got), kind)


def _obj(fields: Mapping[str, _Spec], required: Iterable[str] = ()) -> _Obj:
    return _Obj(dict(fields), frozenset(required))


# ----------------------------------------------------------------------------- job.json


def _attempt(complete: bool) -> _Obj:
    record = _obj(
        {
            "format": STR,
            "attempt": INT,
            "outcome": _Null(STR),
            "last_step": _Null(INT),
            "checkpoint_step": _Null(INT),
            "steps_lost": _Null(INT),
            "resumed_from_step": _Null(INT),
            "world_size": _Null(INT),
            "signal": _Null(STR),
            "hint": _Null(STR),
            "error": _Null(STR),
            "started_at": _Null(STR),
            "ended_at": _Null(STR),
            "first_step_time": _Null(NUM),
            "signal_time": _Null(NUM),
            "restore_s": _Null(NUM),
            "rollbacks": _Null(_List(ANY_OBJ)),
            "notice": _Null(
                _obj(
                    {
                        "provider": STR,
                        "event": STR,
                        "noticed_at": NUM,
                        "deadline": _Null(NUM),
                        "lead_s": _Null(NUM),
                        "saved_at": NUM,
                        "saved_after_s": NUM,
                        "node": _Null(STR),
                        "nodes": _Null(_List(STR)),
                    }
                )
            ),
        }
    )
    disruption = _obj(
        {
            "node": _Null(INT),
            "pod": _Null(STR),
            "reason": _Null(STR),
            "message": _Null(STR),
            "at": _Null(STR),
            "time": _Null(NUM),
        }
    )
    state = _obj(
        {
            "phase": _Null(STR),
            "reason": _Null(STR),
            "nodes": _List(ANY_OBJ),
            "disruptions": _Null(_List(disruption)),
            "start_time": _Null(NUM),
            "end_time": _Null(NUM),
        }
    )
    node = _obj(
        {
            "index": _Null(INT),
            "node_name": _Null(STR),
            "instance_type": _Null(STR),
            "capacity_type": _Null(STR),
        }
    )
    decision = _obj({"action": STR, "capacity": STR, "reason": STR, "delay_s": _Null(NUM)})
    return _obj(
        {
            "attempt": INT,
            "job": ANY_OBJ,
            "status": STR,
            "job_name": STR,
            "try_number": _Null(INT),
            "capacity": STR,
            "nodes": INT,
            "gpus_per_node": INT,
            "args": ANY_LIST,
            "spec": ANY_OBJ,
            "manifests": ANY_LIST,
            "launched_at": STR,
            "ended_at": _Null(STR),
            "state": _Null(state),
            "record": _Null(record),
            "steps_lost": INT,
            "node_types": _List(node),
            "decision": _Null(decision),
            "classification": _Null(STR),
            "reason": _Null(STR),
            "logs_tail": _Null(STR),
        },
        AttemptEntry.__required_keys__ if complete else ("attempt",),
    )


def _job(complete: bool) -> _Obj:
    return _obj(
        {
            "run_uri": STR,
            "config_uri": STR,
            "cluster": STR,
            "capacity": STR,
            "preemptions": INT,
            "infra_failures": INT,
            "status": STR,
            "attempts": _List(_attempt(complete)),
            "budget": _obj(
                {"from_attempt": INT, "preemptions": INT, "infra_failures": INT},
                ("from_attempt", "preemptions", "infra_failures"),
            ),
            # A bill of another format is left to its readers (they say they do not read it).
            "cost": _Null(_obj({"format": STR})),
            "airflow": _obj({"dag_id": STR, "run_id": STR, "task_id": STR, "map_index": INT}),
        },
        JobRecord.__required_keys__ if complete else (),
    )


def _cost(complete: bool) -> _Obj:
    """``job.json``'s ``cost`` (``trainops.cost.accounting.RunCost``)."""
    # a bill from before in-place restarts or rollbacks lacks their phases: its readers count them 0
    seconds = _Map(NUM, tuple(p for p in PHASES if p not in OPTIONAL_PHASES) if complete else ())
    attempt = _obj(
        {
            "attempt": INT,
            "capacity": STR,
            "instance_type": _Null(STR),
            "accelerators": INT,
            "outcome": STR,
            "preempted": BOOL,
            "start": NUM,
            "end": NUM,
            "seconds": seconds,
            "spans": _List(_obj({"phase": STR, "start": NUM, "end": NUM}, Span.__required_keys__)),
            "billed_gpu_s": NUM,
            "cost": NUM,
            "on_demand_cost": NUM,
            "price": _obj(
                {"per_gpu_hour": NUM, "source": STR, "known": BOOL},
                Priced.__required_keys__ if complete else (),
            ),
        },
        AttemptCost.__required_keys__ if complete else (),
    )
    return _obj(
        {
            "format": STR,
            "estimate": BOOL,
            "currency": STR,
            "attempts": _List(attempt),
            "seconds": seconds,
            "billed_gpu_hours": NUM,
            "productive_gpu_hours": NUM,
            "lost_gpu_hours": NUM,
            "goodput": _Null(NUM),
            "recovery_s": _List(NUM),
            "preemptions": INT,
            "cost": NUM,
            "on_demand_cost": NUM,
            "savings": NUM,
            "notes": _List(STR),
            "warnings": _List(STR),
        },
        # a bill from before ``warnings`` existed said its clock warnings in ``notes`` alone
        RunCost.__required_keys__ - {"warnings"} if complete else (),
    )


_JOB = {False: _job(False), True: _job(True)}
_COST = {False: _cost(False), True: _cost(True)}


def check_job(data: object, uri: str, *, complete: bool = False) -> JobRecord:
    """``data``, a run's ``job.json`` read from ``uri``, as a :class:`JobRecord`; ShapeError
    naming the first field that is not as the operator writes it.

    :param complete: also require every field that :func:`trainops.recovery.record.as_job_record`
        and the cost accounting rely on (``python -m trainops cost``); the pages show a missing
        field as missing.
    """
    job = _check(data, uri, _JOB[complete], "job.json")
    cost = job.get("cost")
    if isinstance(cost, dict) and cost.get("format") == COST_FORMAT:
        _raise_problem(uri, _problem(cost, _COST[complete], "cost"), "job.json")
    return as_job_record(job, uri) if complete else cast(JobRecord, job)


# ----------------------------------------------------------------------------- card.json

_METRIC_SET = _obj(
    {
        "eval_loss": _Null(NUM),
        "perplexity": _Null(NUM),
        "tokens": _Null(INT),
        "slices": _Null(_Map(_Map(_obj({"eval_loss": _Null(NUM), "tokens": _Null(INT)})))),
    }
)
_CHECK = _obj(
    {
        "name": STR,
        "kind": _Null(STR),
        "metric": _Null(STR),
        "observed": _Null(NUM),
        "expected": _Null(STR),
        "passed": _Null(BOOL),
        "note": _Null(STR),
    }
)
_CARD = _obj(
    {
        "format": STR,
        "model": STR,
        "version": INT,
        "uri": STR,
        "export_uri": _Null(STR),
        "files": _List(_obj({"path": STR, "size": _Null(INT)}, ("path",))),
        "trainops_version": _Null(STR),
        "promoted_at": _Null(STR),
        "dataset": _Null(
            _obj(
                {
                    "dataset_name": _Null(STR),
                    "version": _Null(STR),
                    "uri": _Null(STR),
                    "manifest_uri": _Null(STR),
                    "rows": _Null(INT),
                    "train_tokens": _Null(INT),
                    "eval_tokens": _Null(INT),
                    "quarantined_rows": _Null(INT),
                    "validation": _Null(
                        _obj(
                            {
                                "uri": _Null(STR),
                                "missing": BOOL,
                                "success": _Null(BOOL),
                                "evaluated_expectations": _Null(INT),
                                "successful_expectations": _Null(INT),
                                "rows": _Null(INT),
                                "failed": _Null(_List(STR)),
                            }
                        )
                    ),
                }
            )
        ),
        "run_uri": _Null(STR),  # rollback copies it into the pointer's history
        "config_uri": _Null(STR),
        "config_sha256": _Null(STR),
        "config": _Null(ANY_OBJ),
        "eval_basis": _Null(ANY_OBJ),
        "metrics": _Null(
            _obj(
                {
                    "candidate": _Null(_METRIC_SET),
                    "production": _Null(_METRIC_SET),
                    "production_version": _Null(INT),
                    "metrics_uri": _Null(STR),
                }
            )
        ),
        "gate": _Null(
            _obj(
                {
                    "approved": _Null(BOOL),
                    "checks": _Null(_List(_CHECK)),
                    "gate_uri": _Null(STR),
                    "production_version": _Null(INT),
                    "check_definitions": _Null(_List(ANY_OBJ)),  # re-gating runs them again
                    "regates": _Null(
                        _List(
                            _obj(
                                {
                                    "production_version": _Null(INT),
                                    "moved_from": _Null(INT),
                                    "approved": _Null(BOOL),
                                    "reason": _Null(STR),
                                }
                            )
                        )
                    ),
                }
            )
        ),
        "training": _Null(
            _obj(
                {
                    "steps": _Null(INT),
                    "attempts": _Null(INT),
                    "preemptions": _Null(INT),
                    "restarts_in_place": _Null(INT),
                    "steps_lost": _Null(INT),
                    "steps_skipped": _Null(_List(_List(INT))),
                    "final_loss": _Null(NUM),
                    "job_uri": _Null(STR),
                }
            )
        ),
        "preemptions_survived": _Null(INT),
        "steps": _Null(INT),
        "training_cost": _Null(
            _obj(
                {
                    "estimate": BOOL,
                    "format": _Null(STR),
                    "currency": _Null(STR),
                    **{
                        key: _Null(NUM)
                        for key in (
                            "cost",
                            "on_demand_cost",
                            "savings",
                            "goodput",
                            "billed_gpu_hours",
                            "productive_gpu_hours",
                            "lost_gpu_hours",
                        )
                    },
                    "preemptions": _Null(INT),
                    "recovery_s": _Null(_List(NUM)),
                    "seconds": _Null(_Map(NUM)),
                    "notes": _Null(_List(STR)),
                    "job_uri": _Null(STR),
                }
            )
        ),
        "lineage": _Null(
            _obj({"parent": _Null(_obj({"name": _Null(STR), "version": _Null(INT), "uri": _Null(STR)}))})
        ),
        "promoted_by": _Null(_obj({"user": _Null(STR), "trigger": _Null(STR), "run_id": _Null(STR)})),
    }
)


def check_card(data: object, uri: str) -> dict[str, Any]:
    """``data``, a model version's ``card.json`` read from ``uri``; ShapeError naming the first
    field that is not as promotion writes it. Every field may be missing (an older card)."""
    return _check(data, uri, _CARD, "card.json")


# ----------------------------------------------------------------------------- production.json


def check_pointer(data: object, uri: str) -> Pointer:
    """``data``, a model's ``production.json`` read from ``uri``, as the registry itself parses
    it (:func:`trainops.registry.pointer.parse_pointer`: the pointer's shape has one
    description); its :class:`~trainops.registry.errors.MalformedPointer` as a ShapeError."""
    try:
        return parse_pointer(data, uri)
    except MalformedPointer as exc:
        if exc.field == "(the whole file)":
            raise ShapeError(uri, None, f"{exc.expected} (a production pointer)", _got(data)) from None
        raise ShapeError(uri, exc.field, exc.expected, exc.got, "production.json") from None


# ----------------------------------------------------------------------------- manifest.json

_SPLIT = _obj(
    {"tokens": INT, "shards": _List(_obj({"path": STR, "tokens": INT}, ("path", "tokens")))}, ("tokens",)
)
_MANIFEST = _obj(
    {
        "format": STR,
        "name": STR,
        "version": STR,
        "created_at": STR,
        "source": ANY_OBJ,
        "tokenizer": ANY_OBJ,
        "token_dtype": STR,
        "splits": _Map(_SPLIT, SPLITS),
        "split_rule": ANY_OBJ,
        "eval_index": _obj({"path": STR, "records": INT, "slice_columns": _List(STR)}),
        "rows": _obj({"total": INT, "train": INT, "eval": INT}),
        "validation": ANY_OBJ,
        "quarantine": _Null(ANY_OBJ),
        "engine": _Null(STR),
    },
    ("format", "splits"),
)


def check_manifest(data: object, uri: str) -> dict[str, Any]:
    """``data``, a dataset version's ``manifest.json`` read from ``uri``; ShapeError naming the
    first field that is not as :func:`trainops.staging.manifest.build_manifest` writes it (a
    manifest of another format is named by its ``format``)."""
    manifest = _check(data, uri, _MANIFEST, "manifest.json")
    if manifest["format"] != MANIFEST_FORMAT:
        raise ShapeError(
            uri, "format", json.dumps(MANIFEST_FORMAT), _got(manifest["format"]), "manifest.json"
        )
    return manifest


# ----------------------------------------------------------------------------- reading


def load(data: bytes | str, uri: str, check: Callable[[object, str], Any]) -> Any:
    """The record in ``data`` (the bytes at ``uri``) as ``check`` returns it; ShapeError when it
    is not JSON (a truncated file) or not the shape ``check`` wants."""
    try:
        value = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise ShapeError(uri, None, "valid JSON", str(exc), _KIND_OF.get(check)) from None
    return check(value, uri)


_KIND_OF: dict[Callable[[object, str], Any], str] = {
    check_job: "job.json",
    check_card: "card.json",
    check_pointer: "production.json",
    check_manifest: "manifest.json",
}


def check_for(uri: str) -> Callable[[object, str], Any] | None:
    """The check for the stored object at ``uri`` by where it lies: ``.../job.json``,
    ``.../models/<name>/versions/<v>/card.json``, ``.../models/<name>/production.json``,
    ``.../datasets/<name>/<version>/manifest.json``; None for any other object."""
    parts = uri.rstrip("/").split("/")
    name = parts[-1]
    if name == "job.json":
        return check_job
    if name == "card.json" and len(parts) >= 5 and parts[-5] == "models" and parts[-3] == "versions":
        return check_card
    if name == "production.json" and len(parts) >= 3 and parts[-3] == "models":
        return check_pointer
    if name == "manifest.json" and len(parts) >= 4 and parts[-4] == "datasets":
        return check_manifest
    return None
