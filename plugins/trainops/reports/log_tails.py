"""The attempts' log tails on a run's report: each folded (``<details>``, closed), cut to its
last :data:`LOG_LINES` lines, with where the whole log is.

``job.json`` keeps the end of each attempt's log (``logs_tail``, clipped by the operator); the
whole log stays where the cluster wrote it: on the local backend each node's file
(``state.nodes[].log``), a link through the report app when the app serves it (the caller's
``linkable``), else its path; on Kubernetes the pods' logs (``kubectl logs``, while the pods
exist). Pure, no I/O; every value is escaped and redacted.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import PurePosixPath
from typing import Any

from trainops.reports.html import dicts, escape, folded, redact, report_link, size_text

__all__ = ["LOG_LINES", "attempt_logs", "tail_lines"]

LOG_LINES = 60  # the last lines of a log shown on a page; the rest is a link or a place


def tail_lines(text: str, limit: int = LOG_LINES) -> tuple[list[str], int]:
    """``(the last limit lines of text, how many lines it has)``."""
    lines = text.splitlines()
    return lines[-limit:], len(lines)


def _whole_log(attempt: Mapping[str, Any], linkable: Callable[[str], bool]) -> str:
    """Where the attempt's whole log is, as HTML: its node log files, or its pods."""
    state = attempt.get("state") if isinstance(attempt.get("state"), dict) else {}
    nodes = dicts(state.get("nodes") if isinstance(state, dict) else None)
    files = [n["log"] for n in nodes if isinstance(n.get("log"), str) and n["log"]]
    if files:
        shown = []
        for path in files:
            uri = path if "://" in path else PurePosixPath(path).as_uri() if path.startswith("/") else ""
            shown.append(report_link(uri) if uri and linkable(uri) else f"<code>{escape(path)}</code>")
        return "The whole log, per node, on the machine that ran the local cluster: " + ", ".join(shown) + "."
    pods = [n["pod"] for n in nodes if isinstance(n.get("pod"), str) and n["pod"]]
    spec = attempt.get("spec") if isinstance(attempt.get("spec"), dict) else {}
    namespace = spec.get("namespace") if isinstance(spec, dict) else None
    ns = f"-n {namespace} " if isinstance(namespace, str) and namespace else ""
    if pods:
        commands = ", ".join(f"<code>kubectl logs {escape(ns)}{escape(p)}</code>" for p in pods)
        return f"The whole log: {commands} (while the pods exist)."
    job = attempt.get("job_name")
    if isinstance(job, str) and job:
        return (
            f"The whole log: <code>kubectl logs {escape(ns)}job/{escape(job)}</code> (while its pods exist)."
        )
    return "The whole log is where the cluster keeps the attempt's output; job.json holds its end only."


def _one(attempt: Mapping[str, Any], index: int, linkable: Callable[[str], bool]) -> str:
    text = str(redact(attempt["logs_tail"]))
    shown, total = tail_lines(text)
    number = attempt.get("attempt", index + 1)
    outcome = attempt.get("classification")
    summary = f"Log tail of attempt {number}" + (
        f" ({outcome})" if isinstance(outcome, str) and outcome else ""
    )
    cut = f"last {len(shown)} of {total} lines" if total > len(shown) else f"{total} line{'s' * (total != 1)}"
    body = f"<pre>{escape(chr(10).join(shown))}</pre>"
    return folded(
        summary,
        body + f'<p class="muted">{_whole_log(attempt, linkable)}</p>',
        note=f"{cut}, {size_text(len(text.encode()))} kept in job.json",
    )


def attempt_logs(job: Mapping[str, Any], linkable: Callable[[str], bool] = lambda _uri: False) -> str:
    """The "Log tails" section: one closed ``<details>`` per attempt that kept a log tail
    ("" when none did).

    :param linkable: whether the report app serves a URI (a node's log file), so the page may
        link to it.
    """
    attempts = dicts(job.get("attempts"))
    parts = [
        _one(a, i, linkable)
        for i, a in enumerate(attempts)
        if isinstance(a.get("logs_tail"), str) and a["logs_tail"].strip()
    ]
    return "<h2>Log tails</h2>" + "".join(parts) if parts else ""
