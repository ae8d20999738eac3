"""The run contract: the whole coupling between the Airflow side and the trainer.

Standard library only. Both halves import this module: the plugin to build
command lines, layouts and to read attempt records; the trainer to honour them.

1. Command line: ``python -m trainer {train,evaluate,export} --config URI [k=v ...]``,
   under torchrun for ``train``. Always an argument list, never a shell string.
2. Environment set by the launcher (torchrun's own, plus the names below).
3. Storage layout under a root URI (``file://`` or ``s3://``).
4. Attempt records: ``attempts/<n>.json``, the trainer's own account of attempt n.
5. ``metrics.jsonl``: one record per step, each with its attempt; the one reader is here.
6. Heartbeats: ``heartbeat/<n>.json``, attempt n's latest step, for hang detection.
"""

# No ``from __future__ import annotations``: TypedDict reads its annotations at run time, so
# ``AttemptRecord.__required_keys__`` leaves the optional fields out.
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, NotRequired, TypedDict, cast

CONTRACT_VERSION = 1

# The trainer modules the Airflow side may import: they import neither torch nor Airflow
# (standard library, PyYAML, boto3 inside the S3 client). Nothing else of the trainer may reach
# a scheduler, worker or triggerer; tests/test_boundaries.py holds both halves to it.
SHARED_MODULES = ("trainer.contract", "trainer.storage", "trainer.config", "trainer.presets")
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


def safe_segment(value: str) -> str:
    """A path segment for ids such as Airflow run ids (``manual__2026-01-01T00:00:00+00:00``).

    Every character outside ``[A-Za-z0-9._=-]`` becomes ``_``, so the same run id maps to
    the same prefix on ``file://`` and ``s3://``. ``.`` and ``..`` are refused: as a segment
    they name the folder itself or its parent, so a user-given name would escape its folder.
    """
    if not value:
        raise ValueError("a layout segment must not be empty")
    if value in (".", ".."):
        raise ValueError(
            f"{value!r} cannot name a dataset, model, run or task: it would point at the folder "
            "itself or its parent; use a name with at least one other character"
        )
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
        return join(self.run_uri, "metrics.jsonl")

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
    them; read them with ``.get``.
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
) -> AttemptRecord:
    """The trainer's account of one attempt.

    ``last_step`` is the number of optimizer steps completed when the attempt ended;
    ``checkpoint_step`` the newest committed checkpoint at that time. ``steps_lost`` is the
    difference: the steps the next attempt must replay.

    :param cause: why a failed attempt failed (one of ``CAUSES``; ``program`` when not given).
    :param metrics_unwritten: step records that never reached ``metrics.jsonl``.
    :param emergency_save_s: seconds the emergency checkpoint took, from the agreed stop to
        its commit (a preempted attempt; the operator compares it with the grace period).
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


# --- 5. metrics.jsonl ----------------------------------------------------------
# One step's record: ``step``, ``attempt``, ``loss``, ``lr``, ``tokens_per_s``, ``time`` and
# optional figures (``mfu``, ``peak_mem_gib``, ...).
MetricsRecord = dict[str, Any]


def metrics_records(text: str) -> list[MetricsRecord]:
    """The well-formed records of a ``metrics.jsonl`` body, in file order: JSON objects with
    an integer ``step``. Anything else (a torn last line, as a reader may see while the
    trainer rewrites the file) is skipped; the rest still counts."""
    out = []
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and isinstance(record.get("step"), int):
            out.append(record)
    return out


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
