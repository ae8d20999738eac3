"""Node 0's trainer log a few lines at a time: the pure half of ``KubernetesCluster.log_lines``
(parsing the API's timestamped lines, dropping what the cursor has seen, capping a call's
lines with :func:`trainops.cluster.base.cap_lines`). Plain strings in, lines and a
:class:`~trainops.cluster.base.LogCursor` (plain JSON) out.

The pod log API has no "since this line": a read asks ``since_seconds`` (whole seconds, so a
little more than needed) with ``timestamps=True``, and the lines the previous read already
returned are dropped by their timestamps. The cursor is ``{"pod", "ts", "n"}``: the pod it
belongs to, the last timestamp seen (as the API wrote it) and how many lines carried exactly
that timestamp.
"""

from __future__ import annotations

import math
import re
from datetime import datetime

from trainops.cluster.base import LogCursor, cap_lines
from trainops.cluster.torchrun_log import fold

# RFC 3339 with up to nanoseconds, as the kubelet writes it (Go's RFC3339Nano drops trailing
# zeros, so "…:05Z" < "…:05.5Z" < "…:05.12Z" in time but not as strings: compare parsed).
TIMESTAMP = re.compile(r"(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2})(?:\.(\d{1,9}))?(Z|[+-]\d{2}:\d{2})")
# the messages of the 400 the API answers for a container that has not started yet
NOT_STARTED = ("ContainerCreating", "PodInitializing", "waiting to start")


def timestamp_key(ts: str | None) -> tuple[int, int] | None:
    """(epoch seconds, nanoseconds) of an RFC 3339 timestamp, for ordering; None if it is not one."""
    match = TIMESTAMP.fullmatch(ts or "")
    if not match:
        return None
    base, fraction, zone = match.groups()
    seconds = datetime.fromisoformat(base + ("+00:00" if zone == "Z" else zone)).timestamp()
    return int(seconds), int((fraction or "").ljust(9, "0"))


def split_timestamp(line: str) -> tuple[str | None, str]:
    """(timestamp, text) of one ``timestamps=True`` line; (None, line) when it has none."""
    ts, _, text = line.partition(" ")
    return (ts, text) if timestamp_key(ts) is not None else (None, line)


def since_seconds(ts: str, now: float) -> int:
    """The ``since_seconds`` that covers everything from ``ts`` on, read at ``now`` (epoch s)."""
    key = timestamp_key(ts)
    if key is None:
        raise ValueError(f"log cursor timestamp {ts!r} is not RFC 3339; start again without a cursor")
    seconds, nanos = key
    return max(1, math.ceil(now - (seconds + nanos / 1e9)) + 1)


def first_read(cursor: LogCursor | None, pod: str) -> bool:
    """True when ``cursor`` has seen nothing of ``pod`` (none yet, or another pod's)."""
    return not cursor or cursor.get("pod") != pod or not cursor.get("ts")


def not_started(status: int | None, message: str) -> bool:
    """True for the API error of a log read whose container has not started yet."""
    return status == 400 and any(m in message for m in NOT_STARTED)


def new_lines(
    text: str,
    cursor: LogCursor | None,
    pod: str,
    max_lines: int,
    *,
    tailed: bool = False,
    keep_partial: bool = True,
    final: bool = True,
) -> tuple[list[str], LogCursor]:
    """The lines of ``text`` that ``cursor`` has not seen, capped to ``max_lines``, without
    their timestamps; and the next cursor.

    :param text: what a ``timestamps=True`` read of ``pod``'s log returned.
    :param cursor: the previous call's cursor; one of another pod counts as none.
    :param tailed: ``text`` is the log's last ``max_lines + 1`` lines, not all since the
        cursor: earlier unseen lines may exist (how many is unknown) when a first read got more
        than ``max_lines`` lines, or when a read past a cursor reaches back to none it saw.
    :param keep_partial: False: a last line without a newline (a read cut at ``limit_bytes``,
        or a line still being written) is left for the next read.
    :param final: the pod has finished, so no more lines follow. torchrun's own traceback is
        folded into one line (:func:`trainops.cluster.torchrun_log.fold`); while the pod runs, a
        traceback still being written is left for the next read (the cursor stops before it).
    """
    seen = None if first_read(cursor, pod) else cursor
    after = timestamp_key(seen["ts"]) if seen else None
    seen_n = int(seen.get("n") or 0) if seen else 0
    dedupe = seen_n
    lines = text.split("\n")
    partial = lines.pop()  # "" when text ends with a newline
    if partial and keep_partial:
        lines.append(partial)
    new, window, overlap = [], [], False  # window: (ts, key) of every line at or after the cursor
    at: list[int] = []  # where each new line is in the window
    ts, key = (seen["ts"], after) if seen else (None, None)
    for line in lines:
        line_ts, body = split_timestamp(line)
        if line_ts is not None:  # a line without one (never seen in practice) keeps the last
            ts, key = line_ts, timestamp_key(line_ts)
        if after is not None and key is not None and key < after:
            overlap = True
            continue
        window.append((ts, key))
        if after is not None and key == after and dedupe > 0:
            dedupe, overlap = dedupe - 1, True
            continue
        at.append(len(window) - 1)
        new.append(body.rstrip("\r"))
    folded, used = fold(new, final=final)
    if used < len(new):  # a traceback still being written: read it again, whole, next time
        window = window[: at[used]]
    next_cursor: LogCursor = {"pod": pod, "ts": seen["ts"] if seen else None, "n": seen["n"] if seen else 0}
    if window and window[-1][1] is not None:
        last_ts, last_key = window[-1]
        count = sum(1 for _, k in window if k == last_key)
        if last_key == after:  # a tail may hold fewer of them than were seen
            count = max(count, seen_n)
        next_cursor = {"pod": pod, "ts": last_ts, "n": count}
    gap = tailed and not overlap and (seen is not None or len(lines) > max_lines)
    return cap_lines(folded, max_lines, None if gap else len(folded)), next_cursor
