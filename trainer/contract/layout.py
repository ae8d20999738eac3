"""The run contract, part 3: names to folders and keys under a root URI (``file://`` or ``s3://``),
and a dataset version's manifest."""

import hashlib
import re
import unicodedata
from dataclasses import dataclass

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
        that started, see ``trainer.checkpoint.fence``). Readers on the Airflow side read ``step``."""
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

    @property
    def promotion(self) -> str:
        """``{"outcome": "promoted" | "identical" | "regate_rejected", "model_name", "version",
        "at"}``: what the promote task did with an approved candidate (the outcome that neither
        the gate's decision nor the production pointer's history can show)."""
        return join(self.run_uri, "eval", "promotion.json")

    @property
    def checkpoint_scores(self) -> str:
        """The folder of mid-run evaluation: one score per scheduled checkpoint
        (:func:`checkpoint_score`), each one's export, and the pick (:attr:`checkpoint_pick`)."""
        return join(self.run_uri, "eval", "checkpoints")

    def checkpoint_score(self, step: int) -> str:
        """Checkpoint ``step``'s evaluation report (``trainer evaluate``'s document), or the
        reason it was skipped (``{"skipped": ...}``)."""
        return join(self.checkpoint_scores, f"step_{int(step):08d}.json")

    def checkpoint_export(self, step: int) -> str:
        """Checkpoint ``step`` exported: what its score was measured on, and what is promoted
        when it is picked."""
        return join(self.checkpoint_scores, f"step_{int(step):08d}", "export")

    @property
    def checkpoint_pick(self) -> str:
        """Which scored checkpoint is the run's candidate, by which metric, and every score."""
        return join(self.run_uri, "eval", "checkpoint_pick.json")


def prune_plan(
    steps: list[int], committed: set[int], keep: int, just_committed: int, held: frozenset[int] = frozenset()
) -> list[int]:
    """Steps whose folders to delete after ``just_committed`` was committed, oldest first.

    Keeps the ``keep`` newest committed checkpoints up to ``just_committed`` (always that one).
    Folders older than it and not kept go: superseded commits and leftovers of interrupted
    saves. Folders newer than it are never touched, whatever wrote them.

    :param held: committed steps kept whatever ``keep`` says (awaiting their mid-run
        evaluation); they do not count towards ``keep``.
    """
    if keep < 1:
        raise ValueError(f"checkpoint.keep must be at least 1, got {keep}")
    candidates = [s for s in sorted(committed | {just_committed}, reverse=True) if s <= just_committed]
    kept = set(candidates[:keep]) | {just_committed} | (held & committed)
    return sorted(s for s in steps if s < just_committed and s not in kept)


# The most checkpoints the trainer keeps for their mid-run evaluation beyond checkpoint.keep:
# the newest ones awaiting a score. Bounds what a run grows by when nothing scores it.
MAX_HELD_FOR_EVAL = 8


def scheduled_for_eval(step: int, every_steps: int, every_checkpoints: int) -> bool:
    """Whether mid-run evaluation scores the checkpoint of ``step``: every
    ``every_checkpoints``-th of the regular checkpoints (steps that are multiples of
    ``every_steps`` times it). 0 turns it off. The trainer keeps such a checkpoint until its
    score is written; the run's last checkpoint is scored too, by the evaluating task."""
    return (
        every_checkpoints > 0
        and every_steps > 0
        and step > 0
        and step % (every_steps * every_checkpoints) == 0
    )


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


# --- metrics parts (their reader: trainer.contract.metrics) ----------------------
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


# --- dataset manifest -----------------------------------------------------------
MANIFEST_FORMAT = "trainops.dataset/v1"
MANIFEST_NAME = "manifest.json"
SPLITS = ("train", "eval")
