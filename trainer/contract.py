"""The run contract: the whole coupling between the Airflow side and the trainer.

Standard library only. Both halves import this module: the plugin to build
command lines, layouts and to read attempt records; the trainer to honour them.

1. Command line: ``python -m trainer {train,evaluate,export} --config URI [k=v ...]``,
   under torchrun for ``train``. Always an argument list, never a shell string.
2. Environment set by the launcher (torchrun's own, plus the names below).
3. Storage layout under a root URI (``file://`` or ``s3://``).
4. Attempt records: ``attempts/<n>.json``, the trainer's own account of attempt n.
5. Metrics: one record per step, each with its attempt, in immutable parts
   ``metrics/part-<attempt>-<n>.jsonl`` (the previous version's ``metrics.jsonl`` is still
   read); the one reader is here, :class:`MetricsReader`.
6. Heartbeats: ``heartbeat/<n>.json``, attempt n's latest step, for hang detection.
"""

# No ``from __future__ import annotations``: TypedDict reads its annotations at run time, so
# ``AttemptRecord.__required_keys__`` leaves the optional fields out.
import hashlib
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NotRequired, Protocol, TypedDict, cast

CONTRACT_VERSION = 1

# The trainer modules the Airflow side may import: they import neither torch nor Airflow
# (standard library, PyYAML, boto3 inside the S3 client). Nothing else of the trainer may reach
# a scheduler, worker or triggerer; tests/test_boundaries.py holds both halves to it.
SHARED_MODULES = ("trainer.contract", "trainer.storage", "trainer.config", "trainer.presets", "trainer.flops")
TRAINER_COMMANDS = ("train", "evaluate", "export")

# --- 2. environment -------------------------------------------------------------
ENV_S3_ENDPOINT = "AWS_ENDPOINT_URL_S3"
ENV_REGION = "AWS_REGION"
ENV_ATTEMPT = "TRAINOPS_ATTEMPT"  # attempt number (1-based) set by the launcher
ENV_CACHE_DIR = "TRAINOPS_CACHE_DIR"  # node-local scratch: downloaded shards, checkpoint staging
# GPUs each node of the job was given (``gpus_per_node``; 0 or unset: none asked for). A trainer
# that sees fewer than its node's ranks need fails before training, as the node's fault.
ENV_GPUS_PER_NODE = "TRAINOPS_GPUS_PER_NODE"


# --- 1. command line ------------------------------------------------------------
def trainer_argv(
    command: str, config_uri: str, overrides: Mapping[str, object] | None = None, python: str = "python"
) -> list[str]:
    """``python -m trainer COMMAND --config URI k=v ...`` as an argument list."""
    if command not in TRAINER_COMMANDS:
        raise ValueError(f"unknown trainer command {command!r}; expected one of {TRAINER_COMMANDS}")
    argv = [python, "-m", "trainer", command, "--config", config_uri]
    for key, value in (overrides or {}).items():
        argv.append(f"{key}={_override_value(value)}")
    return argv


def _override_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    return str(value)


def torchrun_argv(
    trainer_args: list[str],
    *,
    nnodes: int,
    nproc_per_node: int,
    rdzv_endpoint: str,
    rdzv_id: str,
    node_rank: int | None = None,
    shutdown_timeout_s: int = 30,
    is_host: bool | None = None,
) -> list[str]:
    """Wrap ``python -m trainer ...`` (as from :func:`trainer_argv`) in torchrun.

    Rendezvous is c10d at ``rdzv_endpoint``. ``shutdown_timeout_s`` is how long torchrun
    waits for its workers after SIGTERM before SIGKILL: it must fit inside the pod's
    grace period, and it is the emergency checkpoint's budget.
    """
    if trainer_args[1:3] != ["-m", "trainer"]:
        raise ValueError(f"expected 'python -m trainer ...', got {trainer_args[:3]}")
    argv = [
        trainer_args[0],
        "-m",
        "torch.distributed.run",
        f"--nnodes={nnodes}",
        f"--nproc-per-node={nproc_per_node}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={rdzv_endpoint}",
        f"--rdzv-id={rdzv_id}",
        f"--shutdown-timeout={shutdown_timeout_s}",
        "--max-restarts=0",  # recovery is a whole-gang relaunch owned by the operator
    ]
    if node_rank is not None:
        argv.append(f"--node-rank={node_rank}")
    if is_host is not None:
        argv.append(f"--rdzv-conf=is_host={1 if is_host else 0}")
    argv += ["-m", "trainer", *trainer_args[3:]]
    return argv


# --- 3. layout ------------------------------------------------------------------
_UNSAFE = re.compile(r"[^A-Za-z0-9._=-]")
_SAFE = re.compile(r"[A-Za-z0-9._=-]+")
# The longest name kept verbatim as a path segment; S3 allows 1024 bytes a key and most file
# systems 255 a segment, so a run's few segments stay far from both.
MAX_SEGMENT = 128
# Joins a changed name's readable part to the hash of the exact name. It is outside the safe
# alphabet, so no name kept verbatim contains it, and no two names share a segment.
HASH_MARK = "~"
_HASH_CHARS = 12


def safe_segment(value: str) -> str:
    """The path segment of one id or name (a DAG run id, a model or dataset name), injective.

    A name of at most :data:`MAX_SEGMENT` characters from ``[A-Za-z0-9._=-]`` is its own
    segment, as it always was (so existing registries and datasets keep their folders). Any other
    name (``manual__2026-01-01T00:00:00+00:00``, ``fraud model``, ``модель``, a 300-character id)
    becomes a readable prefix, every other character turned to ``_``, then ``~`` and 12 hex digits
    of the SHA-256 of the exact name: ``nightly:2026-01-01`` and ``nightly_2026-01-01`` get two
    folders. ``.`` and ``..`` are refused: as a segment they name the folder itself or its parent,
    so a user-given name would escape its folder.
    """
    if not value:
        raise ValueError("a layout segment must not be empty")
    if value in (".", ".."):
        raise ValueError(
            f"{value!r} cannot name a dataset, model, run or task: it would point at the folder "
            "itself or its parent; use a name with at least one other character"
        )
    if len(value) <= MAX_SEGMENT and _SAFE.fullmatch(value):
        return value
    digest = hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:_HASH_CHARS]
    readable = _UNSAFE.sub("_", value)[: MAX_SEGMENT - _HASH_CHARS - len(HASH_MARK)]
    return f"{readable}{HASH_MARK}{digest}"


# The longest model or dataset name, in characters. Keys and segments stay within S3's 1024
# bytes a key and file systems' 255 bytes a segment whatever the name (safe_segment makes every
# segment at most MAX_SEGMENT ASCII characters), so the limit is not about bytes: it is the
# longest name that can still be its own folder, so that every name of the safe alphabet within
# it is listed under models/ or datasets/ as it was given, never cut short and hashed.
MAX_NAME = MAX_SEGMENT
# Characters a name may not hold: control characters (C0, DEL, C1), invisible format
# characters (bidi overrides, zero-width joiners), surrogates, line and paragraph separators.
# Each is invisible or breaks a line in the logs, reports and messages that show the name, so two
# names that look the same would be two registries.
_NOT_IN_NAMES = ("Cc", "Cf", "Cs", "Zl", "Zp")


def _shown(value: str) -> str:
    """A name as a message shows it: quoted, and cut short when it is long."""
    return repr(value) if len(value) <= 60 else f"{value[:40]!r}... ({len(value)} characters)"


def check_name(value: object, what: str) -> str:
    """``value`` as a model or dataset name, or ValueError naming it and what to do.

    The one check of names, at DAG parse for plain operator arguments, before launch for
    templated ones, and in the registry and staging functions. A name is a string of 1 to
    :data:`MAX_NAME` characters with no control or invisible characters and no whitespace at
    either end, and not ``.`` or ``..``. Any other character is allowed (``fraud model``,
    ``org/model``, ``модель``): :func:`safe_segment` gives each name a folder of its own.

    :param what: how the message names the value, e.g. ``"model_name"``.
    """
    import unicodedata

    if not isinstance(value, str):
        raise ValueError(f"{what} must be a string such as 'demo-lm', got {type(value).__name__} {value!r}")
    if not value.strip():
        raise ValueError(f"{what} {value!r} is empty: give it a name such as 'demo-lm'")
    if len(value) > MAX_NAME:
        raise ValueError(
            f"{what} {_shown(value)} is {len(value)} characters long; at most {MAX_NAME} are allowed "
            f"(a name of up to {MAX_NAME} characters from [A-Za-z0-9._=-] is its own folder): use a "
            "shorter name"
        )
    for i, char in enumerate(value):
        if unicodedata.category(char) in _NOT_IN_NAMES:
            raise ValueError(
                f"{what} {_shown(value)} holds the invisible or control character U+{ord(char):04X} at "
                f"position {i}; names are shown in logs, folders and reports, where it would not be "
                "seen: remove it"
            )
    if value != value.strip():
        raise ValueError(
            f"{what} {value!r} starts or ends with whitespace, which makes it another name than the "
            f"one it looks like: use {value.strip()!r}"
        )
    if value in (".", ".."):
        raise ValueError(
            f"{what} {value!r} is a path step, not a name (it would name the folder itself or its "
            "parent): use a name with at least one other character"
        )
    return value


def legacy_segment(value: str) -> str:
    """The segment trainops gave ``value`` before names mapped injectively (every character
    outside ``[A-Za-z0-9._=-]`` as ``_``), where a registry or dataset of such a name still is
    until it is moved: readers look there only to say so (``trainops.registry.pointer``)."""
    return _UNSAFE.sub("_", value)


def join(root: str, *parts: str) -> str:
    """Join URI segments with single slashes (``file:///a/`` + ``b`` -> ``file:///a/b``)."""
    out = root.rstrip("/")
    for part in parts:
        part = str(part).strip("/")
        if part:
            out = f"{out}/{part}"
    return out


def dataset_prefix(root: str, name: str, version: str) -> str:
    return join(root, "datasets", safe_segment(name), safe_segment(version))


def model_prefix(root: str, name: str) -> str:
    return join(root, "models", safe_segment(name))


def model_version_prefix(root: str, name: str, version: int) -> str:
    return join(model_prefix(root, name), "versions", str(int(version)))


def production_pointer(root: str, name: str) -> str:
    return join(model_prefix(root, name), "production.json")


def run_prefix(root: str, dag_id: str, run_id: str, task_id: str, map_index: int | None = None) -> str:
    """``<root>/runs/<dag_id>/<run_id>/<task_id>[.<map_index>]``."""
    task = task_id if map_index is None or map_index < 0 else f"{task_id}.{map_index}"
    return join(root, "runs", safe_segment(dag_id), safe_segment(run_id), safe_segment(task))


@dataclass(frozen=True)
class RunLayout:
    """Where everything of one training run lives, under its run prefix."""

    run_uri: str

    @property
    def config(self) -> str:
        return join(self.run_uri, "config.yaml")

    @property
    def job(self) -> str:
        return join(self.run_uri, "job.json")

    @property
    def attempts(self) -> str:
        return join(self.run_uri, "attempts")

    def attempt(self, n: int) -> str:
        return join(self.attempts, f"{int(n)}.json")

    @property
    def checkpoints(self) -> str:
        return join(self.run_uri, "checkpoints")

    def checkpoint(self, step: int) -> str:
        return join(self.checkpoints, f"step_{int(step):08d}")

    def checkpoint_files(self, step: int, attempt: int) -> str:
        """Where attempt ``attempt`` writes the files of its checkpoint of ``step``.

        Each attempt writes into a folder of its own, so an old gang still running (a zombie)
        can never overwrite the files of a newer attempt's checkpoint of the same step. The
        ``_COMMITTED`` marker names the folder (``dir``); checkpoints written before attempts
        had folders keep their files directly in ``step_<N>/`` and are read as before.
        """
        if int(attempt) < 1:
            raise ValueError(f"attempt numbers start at 1, got {attempt!r}")
        return join(self.checkpoint(step), f"{ATTEMPT_DIR_PREFIX}{int(attempt)}")

    def committed_marker(self, step: int) -> str:
        return join(self.checkpoint(step), "_COMMITTED")

    @property
    def latest(self) -> str:
        """``{"step", "uri", "attempt", "fence"}``: the newest committed step (0 and no uri
        before the first commit), the attempt that committed it, and the fence (the attempts
        that started, see ``trainer.fence``). Readers on the Airflow side read ``step``."""
        return join(self.checkpoints, "latest.json")

    @property
    def metrics(self) -> str:
        """The previous version's metrics file, rewritten whole at each flush: still read
        (:class:`MetricsReader`), no longer written. Stored trigger arguments and the local
        backend's chaos settings name the run's metrics by it (:func:`metrics_run_uri`)."""
        return join(self.run_uri, "metrics.jsonl")

    @property
    def metrics_parts(self) -> str:
        """The folder of the run's metrics parts, one immutable object per flush."""
        return join(self.run_uri, METRICS_DIR)

    def metrics_part(self, attempt: int, seq: int) -> str:
        """Attempt ``attempt``'s part number ``seq`` (:func:`metrics_part_name`)."""
        return join(self.metrics_parts, metrics_part_name(attempt, seq))

    def heartbeat(self, n: int) -> str:
        """Attempt ``n``'s heartbeat (:class:`Heartbeat`), which rank 0 overwrites as it steps."""
        return join(self.run_uri, "heartbeat", f"{int(n)}.json")

    @property
    def export(self) -> str:
        return join(self.run_uri, "export")

    @property
    def eval_metrics(self) -> str:
        return join(self.run_uri, "eval", "metrics.json")

    @property
    def eval_gate(self) -> str:
        return join(self.run_uri, "eval", "gate.json")


_STEP_DIR = re.compile(r"step_(\d+)$")
ATTEMPT_DIR_PREFIX = "attempt_"
_ATTEMPT_DIR = re.compile(rf"{ATTEMPT_DIR_PREFIX}([1-9]\d*)")


def attempt_of_files_dir(name: str) -> int | None:
    """The attempt number of a checkpoint files folder name (``attempt_3`` -> 3), or None."""
    m = _ATTEMPT_DIR.fullmatch(name)
    return int(m.group(1)) if m else None


def checkpoint_step_of(uri: str) -> int | None:
    """The step number of a ``checkpoints/step_<N>`` prefix, or None."""
    m = _STEP_DIR.search(uri.rstrip("/"))
    return int(m.group(1)) if m else None


# --- 4. attempt records ---------------------------------------------------------
ATTEMPT_FORMAT = "trainops.attempt/v1"
Outcome = Literal["completed", "preempted", "failed"]
OUTCOMES: tuple[Outcome, ...] = ("completed", "preempted", "failed")
# Why a failed attempt failed, as the recovery policy needs it: ``storage`` (storage refused or
# was unreachable after the client's retries), ``network`` (a collective between ranks) and
# ``node`` (the node lacks the GPUs it was given: no driver, a failed device) are the
# infrastructure's, and a relaunch may succeed; ``program`` is everything else.
Cause = Literal["storage", "network", "node", "program"]
CAUSES: tuple[Cause, ...] = ("storage", "network", "node", "program")


class AttemptRecord(TypedDict):
    """``attempts/<n>.json``: what the trainer says happened in attempt n.

    ``cause`` (failed attempts) and ``metrics_unwritten`` (step records the attempt could not
    write to ``metrics.jsonl``, when there were any) are absent from records written before
    them; read them with ``.get``. So are ``first_step_time`` (epoch seconds when the
    attempt's first step began) and ``signal_time`` (epoch seconds when the stop signal came:
    rank 0's own SIGTERM, else the moment the ranks agreed to stop), which the cost accounting
    reads.
    """

    format: str
    attempt: int
    outcome: Outcome
    last_step: int
    checkpoint_step: int | None
    steps_lost: int
    resumed_from_step: int | None
    world_size: int
    signal: str | None
    hint: str | None
    error: str | None
    started_at: str | None
    ended_at: str | None
    cause: NotRequired[Cause]
    metrics_unwritten: NotRequired[int]
    emergency_save_s: NotRequired[float]  # a preempted attempt: its emergency save's seconds
    first_step_time: NotRequired[float]
    signal_time: NotRequired[float]


def attempt_record(
    *,
    attempt: int,
    outcome: str,
    last_step: int,
    checkpoint_step: int | None,
    world_size: int,
    resumed_from_step: int | None = None,
    signal: str | None = None,
    hint: str | None = None,
    error: str | None = None,
    started_at: str | None = None,
    ended_at: str | None = None,
    cause: str | None = None,
    metrics_unwritten: int = 0,
    emergency_save_s: float | None = None,
    first_step_time: float | None = None,
    signal_time: float | None = None,
) -> AttemptRecord:
    """The trainer's account of one attempt.

    ``last_step`` is the number of optimizer steps completed when the attempt ended;
    ``checkpoint_step`` the newest committed checkpoint at that time. ``steps_lost`` is the
    difference: the steps the next attempt must replay.

    :param cause: why a failed attempt failed (one of ``CAUSES``; ``program`` when not given).
    :param metrics_unwritten: step records that never reached ``metrics.jsonl``.
    :param emergency_save_s: seconds the emergency checkpoint took, from the agreed stop to
        its commit (a preempted attempt; the operator compares it with the grace period).
    :param first_step_time: epoch seconds when the attempt's first step began (None: it
        trained none).
    :param signal_time: epoch seconds when the stop signal came (a preempted attempt).
    """
    if outcome not in OUTCOMES:
        raise ValueError(f"unknown attempt outcome {outcome!r}; expected one of {OUTCOMES}")
    if cause is not None and cause not in CAUSES:
        raise ValueError(f"unknown failure cause {cause!r}; expected one of {CAUSES}")
    lost = last_step - (checkpoint_step or 0)
    record: AttemptRecord = {
        "format": ATTEMPT_FORMAT,
        "attempt": int(attempt),
        "outcome": outcome,
        "last_step": int(last_step),
        "checkpoint_step": checkpoint_step,
        "steps_lost": max(0, int(lost)),
        "resumed_from_step": resumed_from_step,
        "world_size": int(world_size),
        "signal": signal,
        "hint": hint,
        "error": error,
        "started_at": started_at,
        "ended_at": ended_at,
    }
    if outcome == "failed":
        record["cause"] = cause or "program"
    if metrics_unwritten:
        record["metrics_unwritten"] = int(metrics_unwritten)
    if emergency_save_s is not None:
        record["emergency_save_s"] = float(emergency_save_s)
    if first_step_time is not None:
        record["first_step_time"] = float(first_step_time)
    if signal_time is not None:
        record["signal_time"] = float(signal_time)
    return record


def parse_attempt_record(data: object) -> AttemptRecord:
    """Check an attempt record read from storage; raise ValueError naming what is wrong."""
    if not isinstance(data, dict) or data.get("format") != ATTEMPT_FORMAT:
        raise ValueError(f"not a {ATTEMPT_FORMAT} record: {str(data)[:200]}")
    if data.get("outcome") not in OUTCOMES:
        raise ValueError(f"attempt record has unknown outcome {data.get('outcome')!r}")
    for key in ("attempt", "last_step", "steps_lost", "world_size"):
        if not isinstance(data.get(key), int):
            raise ValueError(f"attempt record field {key!r} must be an integer, got {data.get(key)!r}")
    if "cause" in data and data["cause"] not in CAUSES:
        raise ValueError(f"attempt record has unknown cause {data['cause']!r}; expected one of {CAUSES}")
    unwritten = data.get("metrics_unwritten", 0)
    if not isinstance(unwritten, int) or isinstance(unwritten, bool) or unwritten < 0:
        raise ValueError(
            f"attempt record field 'metrics_unwritten' must be an integer >= 0, got {unwritten!r}"
        )
    save_s = data.get("emergency_save_s", 0.0)
    if isinstance(save_s, bool) or not isinstance(save_s, int | float) or save_s < 0:
        raise ValueError(
            f"attempt record field 'emergency_save_s' must be a number of seconds >= 0, got {save_s!r}"
        )
    for key in ("first_step_time", "signal_time"):
        value = data.get(key, 0.0)
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise ValueError(
                f"attempt record field {key!r} must be epoch seconds (a number >= 0), got {value!r}"
            )
    return cast(AttemptRecord, data)


# When even the attempt record cannot be written (storage is down), the trainer prints it as
# the last line of rank 0's output, after this mark; the operator finds it in the log tail.
ATTEMPT_LINE_MARK = "trainops-attempt-record: "
# An infrastructure failure also prints a first, early record on every rank at once, before the
# slow clean-up (rank 0 may be stopped before its final line). It counts only when no final
# line is there: a slower rank's early line may come after rank 0's complete one.
EARLY_ATTEMPT_LINE_MARK = "trainops-attempt-record-early: "


def attempt_record_line(record: AttemptRecord, *, early: bool = False) -> str:
    """``record`` as one marked log line (see :func:`attempt_record_in_log`); ``early``: the
    first record an infrastructure failure prints, before the final one."""
    mark = EARLY_ATTEMPT_LINE_MARK if early else ATTEMPT_LINE_MARK
    return mark + json.dumps(record, sort_keys=True, separators=(",", ":"))


def attempt_record_in_log(text: str, attempt: int) -> AttemptRecord | None:
    """The record of ``attempt`` that the trainer printed instead of storing it: the last
    final marked line of ``text`` (a log tail; lines may carry a prefix such as ``[node-0] ``)
    that holds a valid record of that attempt, else the last early one. None when there is
    none."""
    found: dict[str, AttemptRecord] = {}
    for line in text.splitlines():
        for kind, mark in (("early", EARLY_ATTEMPT_LINE_MARK), ("final", ATTEMPT_LINE_MARK)):
            _, marked, body = line.partition(mark)
            if not marked:
                continue
            try:
                record = parse_attempt_record(json.loads(body))
            except ValueError:  # a torn or foreign line: the others still count
                break
            if record["attempt"] == attempt:
                found[kind] = record
            break
    return found.get("final") or found.get("early")


# --- 5. metrics ----------------------------------------------------------------
# One step's record: ``step``, ``attempt``, ``loss``, ``lr``, ``tokens_per_s``, ``time`` and
# optional figures (``mfu``, ``peak_mem_gib``, ...); readers carry unknown fields through.
MetricsRecord = dict[str, Any]

# Rank 0 writes each flush as a new immutable part, ``<run>/metrics/part-<attempt>-<n>.jsonl``
# (``n`` counts that attempt's parts from 1; zero-padded so that a listing sorts them), never
# rewriting one: a run's metrics cost O(steps) bytes. The previous version rewrote one
# ``<run>/metrics.jsonl`` (``RunLayout.metrics``) whole at each flush; readers still read it.
METRICS_DIR = "metrics"
_METRICS_PART = re.compile(r"part-(\d+)-(\d+)\.jsonl")


def metrics_part_name(attempt: int, seq: int) -> str:
    """The file name of attempt ``attempt``'s part number ``seq`` (both from 1)."""
    if int(attempt) < 1 or int(seq) < 1:
        raise ValueError(f"metrics parts are numbered from 1, got attempt {attempt!r}, part {seq!r}")
    return f"part-{int(attempt):06d}-{int(seq):08d}.jsonl"


def metrics_part_key(uri: str) -> tuple[int, int] | None:
    """``(attempt, seq)`` of a metrics part's URI or file name; None for anything else."""
    m = _METRICS_PART.fullmatch(uri.rsplit("/", 1)[-1])
    return (int(m.group(1)), int(m.group(2))) if m else None


def metrics_run_uri(uri: str) -> str:
    """The run prefix that a metrics location belongs to: ``<run>/metrics.jsonl`` (what
    ``RunLayout.metrics`` names, and what stored trigger arguments hold) and ``<run>/metrics``
    give ``<run>``; any other URI is taken as the run prefix itself."""
    for suffix in ("/metrics.jsonl", f"/{METRICS_DIR}"):
        if uri.rstrip("/").endswith(suffix):
            return uri.rstrip("/")[: -len(suffix)]
    return uri.rstrip("/")


def metrics_records(text: str) -> list[MetricsRecord]:
    """The well-formed records of a metrics body (a part, or the legacy ``metrics.jsonl``), in
    file order: JSON objects with an integer ``step``. Anything else (a torn last line, as a
    reader may see while the previous version rewrote the file) is skipped; the rest counts."""
    out = []
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and isinstance(record.get("step"), int):
            out.append(record)
    return out


def merge_metrics(bodies: Sequence[list[MetricsRecord]]) -> list[MetricsRecord]:
    """The run's records from its metrics objects, given in order (the legacy file first, then
    the parts by attempt and number): each object's records of an attempt replace that
    attempt's records from earlier objects from the object's first step of it on, so a rerun
    under the same attempt number replaces its own tail (and keeps the steps it did not
    replay) and a part written twice counts once. Other attempts' records are never touched:
    a stale gang cannot erase a newer attempt's records. Grouped by attempt, in order."""
    by_attempt: dict[int, list[MetricsRecord]] = {}
    for records in bodies:
        firsts: dict[int, int] = {}
        for record in records:
            firsts.setdefault(_attempt_of(record), record["step"])
        for attempt, first in firsts.items():
            kept = by_attempt.setdefault(attempt, [])
            if kept and any(r["step"] >= first for r in kept):
                kept[:] = [r for r in kept if r["step"] < first]
        for record in records:
            by_attempt[_attempt_of(record)].append(record)
    return [r for attempt in sorted(by_attempt) for r in by_attempt[attempt]]


def _attempt_of(record: MetricsRecord) -> int:
    """A record's attempt number for merging; 0 for a record without a usable one."""
    attempt = record.get("attempt")
    return attempt if isinstance(attempt, int) and not isinstance(attempt, bool) else 0


def metrics_by_step(records: list[MetricsRecord]) -> dict[int, MetricsRecord]:
    """One record per step: that of the highest attempt that reached it (a relaunched attempt
    replays the steps after its last checkpoint); within one attempt, the later record."""
    out: dict[int, MetricsRecord] = {}
    for record in records:
        step = record["step"]
        if step not in out or record.get("attempt", 0) >= out[step].get("attempt", 0):
            out[step] = record
    return out


def latest_of_attempt(records: list[MetricsRecord], attempt: int) -> MetricsRecord | None:
    """The record of the highest step ``attempt`` reached, or None."""
    mine = [r for r in records if r.get("attempt") == attempt]
    return max(mine, key=lambda r: r["step"]) if mine else None


def max_step_of_attempt(records: list[MetricsRecord], attempt: int) -> int:
    """The highest step ``attempt`` recorded (0 if none)."""
    latest = latest_of_attempt(records, attempt)
    return int(latest["step"]) if latest else 0


def last_record(records: Iterable[MetricsRecord]) -> MetricsRecord | None:
    """The run's last logged step's record: the highest step, and at it the highest attempt's
    (as :func:`metrics_by_step` would pick it); None when there is none."""
    return max(records, key=lambda r: (r["step"], _attempt_of(r)), default=None)


class MetricsStorage(Protocol):
    """What :class:`MetricsReader` needs of a storage client (``trainer.storage.Storage``)."""

    def list(self, prefix_uri: str) -> list[str]: ...

    def get_with_etag(self, uri: str) -> tuple[bytes, str]: ...

    def head(self, uri: str) -> dict[str, Any] | None: ...


class MetricsTooLarge(ValueError):
    """A run's metrics hold more bytes than the reader was allowed to read."""


class MetricsReader:
    """The one reader of a run's metrics, for the trigger, the operator, the report app and the
    local supervisor. It keeps what it read: each part is immutable, so a reader that polls
    fetches only the parts that are new since its last read (a listing, then one GET per new
    part), and the legacy ``metrics.jsonl`` again only when its etag changed.

    :param storage: the client for ``run_uri``.
    :param run_uri: the run prefix (or its ``metrics.jsonl``, see :func:`metrics_run_uri`).
    :param attempt: read only this attempt's parts (the trigger and the supervisor follow one
        attempt, and keep no other attempt's records in memory).
    :param max_bytes: raise :class:`MetricsTooLarge` once the records held would pass this
        many bytes (the report app's cap); None: no cap.
    :param check: called with every object URI before it is read; raises to refuse it (the
        report app refuses a file that a symbolic link places outside its root).
    :param workers: parts fetched at once when many are new (a report's first read of a long run).
    """

    def __init__(
        self,
        storage: MetricsStorage,
        run_uri: str,
        *,
        attempt: int | None = None,
        max_bytes: int | None = None,
        check: Callable[[str], None] | None = None,
        workers: int = 8,
    ):
        self.storage, self.attempt, self.max_bytes = storage, attempt, max_bytes
        self.run_uri = metrics_run_uri(run_uri)
        self.legacy_uri = join(self.run_uri, "metrics.jsonl")
        self.parts_uri = join(self.run_uri, METRICS_DIR)
        self.check, self._workers = check, max(1, workers)
        self._parts: dict[tuple[int, int], list[MetricsRecord]] = {}
        self._sizes: dict[tuple[int, int], int] = {}
        self._legacy: list[MetricsRecord] = []
        self._legacy_etag: str | None = None
        self._legacy_size = 0
        self._size_held = 0  # bytes of the objects whose records are held
        self.found = False  # whether the last read found any metrics object of the run (any attempt)
        self.bytes_read = 0  # bytes fetched so far (parts and legacy file), for tests and benchmarks

    @property
    def parts_held(self) -> int:
        """How many parts this reader holds the records of."""
        return len(self._parts)

    @property
    def held_bytes(self) -> int:
        """Bytes of the objects whose records this reader holds."""
        return self._size_held

    def records(self) -> list[MetricsRecord]:
        """Every record (of ``attempt``, when set), merged (:func:`merge_metrics`); reads what is new."""
        self._refresh_legacy()
        listed = self._listed()
        self._fetch({k: u for k, u in listed.items() if k not in self._parts})
        return self._merged(sorted(listed))

    def latest(self) -> dict[int, MetricsRecord]:
        """Each attempt's record of the highest step it reached, reading only each attempt's
        newest part (and the legacy file): a part replaces its attempt's records from its first
        step on, so nothing before the newest part can hold a higher step. A reader used for
        this keeps only the newest parts, so its memory stays flat over a long run."""
        self._refresh_legacy()
        listed = self._listed()
        newest: dict[int, tuple[int, int]] = {}
        for key in listed:
            newest[key[0]] = max(newest.get(key[0], key), key)
        keys = sorted(newest.values())
        for older in set(self._parts) - set(keys):
            self._forget(older)
        self._fetch({k: listed[k] for k in keys if k not in self._parts})
        merged = self._merged(keys)
        out: dict[int, MetricsRecord] = {}
        for attempt in sorted({_attempt_of(r) for r in merged}):
            found = latest_of_attempt(merged, attempt)
            if found is not None:
                out[attempt] = found
        return out

    def _merged(self, keys: list[tuple[int, int]]) -> list[MetricsRecord]:
        return merge_metrics([self._legacy, *(self._parts[k] for k in keys if k in self._parts)])

    def _listed(self) -> dict[tuple[int, int], str]:
        """The parts there now (of ``attempt``, when set), by key."""
        listed, any_part = {}, False
        for uri in self.storage.list(self.parts_uri):
            key = metrics_part_key(uri)
            if key is None or not uri.endswith(f"/{METRICS_DIR}/{metrics_part_name(*key)}"):
                continue  # not a part, or one in a folder below
            any_part = True
            if self.attempt is None or key[0] == self.attempt:
                listed[key] = uri
        for gone in set(self._parts) - set(listed):  # deleted (a run pruned): forgotten too
            self._forget(gone)
        self.found = any_part or self._legacy_etag is not None
        return listed

    def _fetch(self, wanted: dict[tuple[int, int], str]) -> None:
        keys = sorted(wanted)
        uris = [wanted[k] for k in keys]
        for uri in uris:
            if self.check is not None:
                self.check(uri)
        if len(uris) > 1 and self._workers > 1:
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(min(self._workers, len(uris))) as pool:
                bodies = list(pool.map(self._get, uris))
        else:
            bodies = [self._get(uri) for uri in uris]
        self._allow(sum(len(b) for b in bodies if b is not None))
        for key, body in zip(keys, bodies, strict=True):
            if body is not None:  # None: listed, then deleted before the read
                self._parts[key] = metrics_records(body.decode("utf-8", "replace"))
                self._sizes[key] = len(body)
                self._size_held += len(body)

    def _get(self, uri: str) -> bytes | None:
        try:
            body = self.storage.get_with_etag(uri)[0]
        except FileNotFoundError:  # trainer.storage.NotFound is one
            return None
        self.bytes_read += len(body)
        return body

    def _refresh_legacy(self) -> None:
        head = self.storage.head(self.legacy_uri)
        if head is not None and head.get("etag") == self._legacy_etag:
            return
        self._size_held -= self._legacy_size
        self._legacy, self._legacy_etag, self._legacy_size = [], None, 0
        if head is None:
            return
        self._allow(int(head.get("size", 0)))  # before reading: the file is read whole
        if self.check is not None:
            self.check(self.legacy_uri)
        try:
            body, etag = self.storage.get_with_etag(self.legacy_uri)
        except FileNotFoundError:  # deleted since the head
            return
        self.bytes_read += len(body)
        self._allow(len(body))
        records = metrics_records(body.decode("utf-8", "replace"))
        if self.attempt is not None:
            records = [r for r in records if r.get("attempt") == self.attempt]
        self._legacy, self._legacy_etag, self._legacy_size = records, etag, len(body)
        self._size_held += len(body)

    def _forget(self, key: tuple[int, int]) -> None:
        del self._parts[key]
        self._size_held -= self._sizes.pop(key)

    def _allow(self, more: int) -> None:
        """Raise :class:`MetricsTooLarge` if holding ``more`` bytes would pass ``max_bytes``."""
        if self.max_bytes is not None and self._size_held + more > self.max_bytes:
            raise MetricsTooLarge(
                f"the metrics under {self.run_uri!r} hold more than the {self.max_bytes} bytes this "
                "reader may read; read them with your storage tools instead"
            )


# --- dataset manifest -----------------------------------------------------------
MANIFEST_FORMAT = "trainops.dataset/v1"
MANIFEST_NAME = "manifest.json"
SPLITS = ("train", "eval")


# --- 6. heartbeats ----------------------------------------------------------------
class Heartbeat(TypedDict):
    """Attempt ``attempt``'s progress as rank 0 last wrote it: ``step`` finished at ``time``
    (epoch seconds), ``steps`` of them in this attempt (0: written before its first step, when
    the loop started), and the median step time of this attempt so far, its first step
    (compile, warm-up) left out (None until there is one)."""

    attempt: int
    step: int
    time: float
    steps: int
    median_step_s: float | None


def parse_heartbeat(data: object) -> Heartbeat | None:
    """``data`` (a heartbeat object's JSON) as a :class:`Heartbeat`; None when it is not one
    (a damaged or foreign object says nothing about progress, so it is no verdict either)."""
    if not isinstance(data, dict):
        return None
    try:
        median = data.get("median_step_s")
        return {
            "attempt": int(data["attempt"]),
            "step": int(data["step"]),
            "time": float(data["time"]),
            "steps": int(data["steps"]),
            "median_step_s": None if median is None else float(median),
        }
    except (KeyError, TypeError, ValueError):
        return None
