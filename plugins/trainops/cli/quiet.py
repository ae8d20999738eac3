"""What the quiet ``python -m trainops demo`` prints: pure functions over the rows and records
it reads (task instances, ``job.json`` attempt entries, metrics records).

An attempt's line is decided from its entry in ``job.json`` (the operator's classification,
the trainer's attempt record, the backend's disruptions), never from exit codes or log text:
torchrun exits 1 on SIGTERM whatever the workers did.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, TypedDict

from trainops.recovery.classify import restart_note

TRACEBACK = "Traceback (most recent call last):"
# torchrun's lines in a node's log: its folded error, its glog lines (E1201 12:00:00.000 42 ...)
_TORCHRUN_NOTE = re.compile(r"^(\[node-\d+\] )?(torchrun: |[EWI]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ )")
FINAL_TASK_STATES = frozenset({"success", "failed", "skipped", "upstream_failed", "removed"})
# The last lines of a failed attempt's log shown on the terminal (the trainer's, not torchrun's).
ERROR_LINES = 8


class TaskRow(TypedDict):
    """One task instance as read from Airflow's metadata DB."""

    task_id: str
    state: str | None
    try_number: int
    duration: float | None


def task_line(row: TaskRow) -> str:
    """``stage        success    2.3s  (try 1)``."""
    duration = "" if row["duration"] is None else f"{row['duration']:.1f}s"
    return f"{row['task_id']:<12} {row['state'] or '-':<16} {duration:>7}  (try {row['try_number']})"


def _how(entry: Mapping[str, Any]) -> str:
    """What stopped an attempt, in a few words: ``injected SIGTERM``, ``spot interruption``."""
    state = entry.get("state") or {}
    disruptions = state.get("disruptions") or []
    record = entry.get("record") or {}
    signal = record.get("signal")
    if any(str(d.get("message", "")).startswith("injected") for d in disruptions):
        return f"injected {signal or 'SIGTERM'}"
    notice = record.get("notice")
    if notice:
        return f"spot notice: {notice.get('provider')} {notice.get('event')}"
    if disruptions:
        return str(disruptions[0].get("reason") or "disruption")
    return f"{signal}" if signal else str(entry.get("classification") or "ended")


def attempt_line(entry: Mapping[str, Any], total_steps: int | None = None) -> str | None:
    """The one line for an ended attempt of ``job.json`` (None: not ended yet).

    A preemption reads ``attempt 1 preempted at step 55 (injected SIGTERM); resuming from
    checkpoint step 55``; a failure names its reason and the decision; success its steps.
    """
    if entry.get("status", "ended") != "ended" or "classification" not in entry:
        return None
    n = entry["attempt"]
    record = entry.get("record") or {}
    step = record.get("last_step")
    at = f" at step {step}" if step is not None else ""
    decision = entry.get("decision") or {}
    relaunch = decision.get("action") == "relaunch"
    classification = entry["classification"]
    note = restart_note(record)  # a failure's reason says it already
    restarted = f"; {note}" if note else ""
    if classification == "succeeded" or record.get("outcome") == "completed":
        of = f"/{total_steps}" if total_steps else ""
        return f"attempt {n} completed{at}{of}{restarted}"
    if classification == "preempted":
        line = f"attempt {n} preempted{at} ({_how(entry)}){restarted}"
        checkpoint = record.get("checkpoint_step")
        if relaunch:
            resume = f"checkpoint step {checkpoint}" if checkpoint else "the newest checkpoint"
            return f"{line}; resuming from {resume}"
        return f"{line}; {decision.get('reason') or 'not relaunched'}"
    reason = entry.get("reason") or record.get("error") or classification
    then = f"; {decision['reason']}" if decision.get("reason") else ""
    return f"attempt {n} {classification}{at}: {reason}{then}"


def error_lines(entry: Mapping[str, Any], count: int = ERROR_LINES) -> list[str]:
    """What a failed attempt's kept log tail says of the error, indented for the terminal: the
    end of the trainer's last traceback when there is one, else the last ``count`` lines.
    torchrun's own traceback is already folded out of the tail by the backend, and torchrun's
    one-line notes (``torchrun: ...``, its ``E``/``W``/``I`` log lines) are left out here."""
    tail = [line for line in str(entry.get("logs_tail") or "").splitlines() if not _TORCHRUN_NOTE.match(line)]
    starts = [i for i, line in enumerate(tail) if line.endswith(TRACEBACK)]
    if starts:
        node = tail[starts[-1]].split(" ", 1)[0]  # "[node-0]": that node's lines only
        block = [line for line in tail[starts[-1] :] if line.split(" ", 1)[0] == node]
        return [f"    {line}" for line in block[-count:]]
    return [f"    {line}" for line in tail[-count:]]


def _clock(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def progress_text(
    attempt: int, record: Mapping[str, Any], total: int | None, steps_per_s: float | None
) -> str:
    """``attempt 2: step 70/120  loss 2.128  13,634 tok/s  ETA 4s``."""
    step = int(record["step"])
    of = f"/{total}" if total else ""
    parts = [f"attempt {attempt}: step {step}{of}"]
    if record.get("loss") is not None:
        parts.append(f"loss {float(record['loss']):.3f}")
    if record.get("tokens_per_s"):
        parts.append(f"{float(record['tokens_per_s']):,.0f} tok/s")
    if total and steps_per_s:
        parts.append(f"ETA {_clock((total - step) / steps_per_s)}")
    return "  ".join(parts)


def bar(step: int, total: int | None, width: int = 24) -> str:
    """``[#########---------------]`` for a terminal's progress bar."""
    if not total:
        return ""
    done = max(0, min(width, round(width * step / total)))
    return "[" + "#" * done + "-" * (width - done) + "] "


def progress_due(step: int, last_printed: int | None, total: int | None, every: int | None = None) -> bool:
    """Whether a non-terminal output prints a progress line for ``step``: every ``every``
    steps (default: a fifth of the run), and the last step."""
    if last_printed is not None and step <= last_printed:
        return False
    every = every or max(1, (total or 100) // 5)
    if total and step >= total:
        return True
    previous = -1 if last_printed is None else last_printed
    return step // every > previous // every
