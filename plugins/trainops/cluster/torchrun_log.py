"""torchrun's own traceback in a node's log, folded into one line.

When a worker exits non-zero (a preempted trainer exits 143 after its emergency checkpoint,
a crashed one exits 1) or the agent itself is signalled, torchrun raises ``ChildFailedError``
or ``SignalException`` and prints its own traceback (frames of ``torch/distributed/run.py``)
and a failure summary: some 34 lines that say nothing the attempt record does not, and read as
a crash even for an expected preemption. What the attempt amounts to is decided from the
attempt record (``trainops.recovery.classify``), never from these lines; the trainer's own
lines, including a real error's traceback, pass through untouched.

:func:`fold` is pure. Both backends apply it to the lines they stream into the task log and to
the log tail kept in ``job.json``: the local one to its node logs, the Kubernetes one to the
pods' logs (a pod runs one torchrun agent, which writes the same block).
"""

from __future__ import annotations

import re

TRACEBACK = "Traceback (most recent call last):"
# torchrun's exceptions: the agent's, never the trainer's (the trainer imports no elastic code)
_WRAPPER_EXCEPTION = re.compile(r"^torch\.distributed\.elastic\.\S+(Error|Exception):")
_SUMMARY_RULE = re.compile(r"^={20,}$")
_FIELD = re.compile(r"^\s*(rank|exitcode)\s*:\s*(\S+)")
_SIGNAL = re.compile(r"got signal: (\d+)")
# A block still open after this many lines is not torchrun's: let it through as it is.
MAX_BLOCK_LINES = 120

_SIGNAL_NAMES = {1: "SIGHUP", 2: "SIGINT", 9: "SIGKILL", 15: "SIGTERM"}


def _signal_name(number: int) -> str:
    return _SIGNAL_NAMES.get(number, f"signal {number}")


def _exit_text(code: str) -> str:
    """``143`` -> ``143 (SIGTERM)``: torch reports a signalled worker as 128 + the signal."""
    try:
        value = int(code)
    except ValueError:
        return code
    if value > 128:
        return f"{value} ({_signal_name(value - 128)})"
    if value < 0:
        return f"{value} ({_signal_name(-value)})"
    return str(value)


def _summary_line(exception: str, fields: dict[str, str]) -> str:
    """The one line that stands for a folded traceback."""
    found = _SIGNAL.search(exception)
    if found:
        return f"torchrun: stopped by {_signal_name(int(found.group(1)))}; its traceback is left out"
    rank = fields.get("rank", "?")
    code = _exit_text(fields.get("exitcode", "?"))
    return f"torchrun: worker rank {rank} exited with code {code}; torchrun's traceback is left out"


def _block_end(lines: list[str], start: int) -> tuple[int, str | None, dict[str, str]] | None:
    """Where the traceback starting at ``lines[start]`` ends (the index after it), its
    exception line when torchrun's (None: someone else's), and the summary's fields; None
    when the block is not complete yet."""
    i = start + 1
    while i < len(lines) and (lines[i].startswith(" ") or lines[i].startswith("\t")):
        i += 1
    if i >= len(lines):
        return None
    exception = lines[i]
    if not _WRAPPER_EXCEPTION.match(exception):
        return i + 1, None, {}
    i += 1
    fields: dict[str, str] = {}
    if i < len(lines) and _SUMMARY_RULE.match(lines[i].strip()):
        j = i + 1
        while j < len(lines) and not _SUMMARY_RULE.match(lines[j].strip()):
            found = _FIELD.match(lines[j])
            if found and found.group(1) not in fields:
                fields[found.group(1)] = found.group(2)
            j += 1
        if j >= len(lines):
            return None
        i = j + 1
    elif i >= len(lines) and "ChildFailedError" in exception:
        return None  # its summary follows
    return i, exception, fields


def fold(lines: list[str], *, final: bool = True) -> tuple[list[str], int]:
    """``lines`` with each torchrun traceback (and its failure summary) replaced by one line,
    and how many of ``lines`` were used.

    :param final: whether no more lines will follow. When False, a traceback still being
        written at the end is left unused (the count stops before it), for the next call to
        read again with the rest; a block longer than :data:`MAX_BLOCK_LINES` is used as it is.
    """
    out: list[str] = []
    i = 0
    while i < len(lines):
        if lines[i].strip() != TRACEBACK:
            out.append(lines[i])
            i += 1
            continue
        end = _block_end(lines, i)
        if end is None:
            if not final and len(lines) - i <= MAX_BLOCK_LINES:
                return out, i
            out.extend(lines[i:])
            return out, len(lines)
        stop, exception, fields = end
        if exception is None:
            out.extend(lines[i:stop])
        else:
            out.append(_summary_line(exception, fields))
        i = stop
    return out, len(lines)
