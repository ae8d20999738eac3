"""Helpers shared by the report tests: a page as a reader sees it, and a training run's records."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser

from trainops.cluster.spec import JobSpec
from trainops.recovery.record import append_attempt, start_record

JOB_URI = "s3://bucket/root/runs/retrain/manual_1/train/job.json"


class _Page(HTMLParser):
    """Visible text and tables (rows of cell texts) of a page."""

    _BLOCKS = frozenset(
        {
            "table",
            "tr",
            "td",
            "th",
            "p",
            "li",
            "ol",
            "h1",
            "h2",
            "pre",
            "header",
            "br",
            "div",
            "summary",
            "h3",
        }
    )

    def __init__(self, html: str):
        super().__init__()
        self.text: list[str] = []
        self.tables: list[list[list[str]]] = []
        self._open: list[list[list[str]]] = []
        self._cells: list[list[str]] = []
        self._skip = False
        self.feed(html)

    def _data(self, data: str) -> None:
        self.text.append(data)
        for cell in self._cells:  # a nested table's text belongs to the enclosing cells too
            cell.append(data)

    def handle_starttag(self, tag, attrs):
        if tag in ("style", "title"):
            self._skip = True
        if tag in self._BLOCKS:
            self._data(" ")
        if tag == "table":
            self._open.append([])
            self.tables.append(self._open[-1])
        elif tag == "tr" and self._open:
            self._open[-1].append([])
        elif tag in ("td", "th") and self._open:
            self._cells.append([])

    def handle_endtag(self, tag):
        if tag in ("style", "title"):
            self._skip = False
        if tag in ("td", "th") and self._cells:
            self._open[-1][-1].append(" ".join("".join(self._cells.pop()).split()))
        elif tag == "table" and self._open:
            self._open.pop()
        if tag in self._BLOCKS:
            self._data(" ")

    def handle_data(self, data):
        if not self._skip:
            self._data(data)


def page_text(html: str) -> str:
    return " ".join("".join(_Page(html).text).split())


def main_text(html: str) -> str:
    """The visible text below the bar of links the app puts on every page (``html.framed``)."""
    return page_text(re.sub(r'<nav class="frame">.*?</nav>', "", html, count=1, flags=re.S))


def page_tables(html: str) -> list[list[list[str]]]:
    return _Page(html).tables


def table_with(html: str, header: str, skip: int = 0) -> list[list[str]]:
    """The first table (after ``skip`` others) whose first row starts with ``header``."""
    tables = [t for t in page_tables(html) if t and t[0] and t[0][0] == header]
    return tables[skip]


def svgs(html: str) -> dict[str, str]:
    """Each inline chart of a page by its accessible name (``aria-label``), the linear drawing
    of a chart that also has a log-scale one (which gets the key ``<name> (log)``)."""
    out: dict[str, str] = {}
    for svg in re.findall(r"<svg .*?</svg>", html, flags=re.S):
        label = re.search(r'aria-label="([^"]*)"', svg)
        name = label.group(1) if label else ""
        out[f"{name} (log)" if name in out else name] = svg
    return out


class Svg(HTMLParser):
    """The inline charts' shapes: polylines (their points), dots and labelled texts."""

    def __init__(self, html: str):
        super().__init__()
        self.svgs = 0
        self.lines: list[tuple[str, list[tuple[float, float]]]] = []
        self.dots: list[tuple[float, float]] = []
        self.ticks: dict[str, str] = {}
        self.legend: list[str] = []
        self._text_class: str | None = None
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "svg":
            self.svgs += 1
        elif tag == "polyline":
            points = [tuple(map(float, p.split(","))) for p in attrs["points"].split()]
            self.lines.append((attrs.get("data-series", ""), points))
        elif tag == "circle":
            self.dots.append((float(attrs["cx"]), float(attrs["cy"])))
        elif tag == "text":
            self._text_class = attrs.get("class", "")

    def handle_endtag(self, tag):
        if tag == "text":
            self._text_class = None

    def handle_data(self, data):
        if self._text_class and self._text_class.startswith("tick "):
            self.ticks[self._text_class.split()[1]] = data
        elif self._text_class == "legend":
            self.legend.append(data)


def metrics_jsonl(*rows: tuple) -> str:
    """``(attempt, step, loss, tokens_per_s)`` rows as the trainer writes them."""
    return "".join(
        json.dumps(
            {
                "step": step,
                "loss": loss,
                "lr": 1e-3,
                "tokens_per_s": tps,
                "attempt": attempt,
                "time": 1.0e9 + step,
            }
        )
        + "\n"
        for attempt, step, loss, tps in rows
    )


def run_job(**extra) -> dict:
    """A job.json shaped like FSDPTrainingOperator's: a preempted spot attempt, then a finished one."""
    return {
        "run_uri": JOB_URI.rsplit("/", 1)[0],
        "config_uri": JOB_URI.replace("job.json", "config.yaml"),
        "cluster": "kubernetes",
        "capacity": "on-demand",
        "preemptions": 1,
        "infra_failures": 0,
        "status": "succeeded",
        "attempts": [
            {
                "attempt": 1,
                "capacity": "spot",
                "launched_at": "2026-01-01T00:00:00+00:00",
                "ended_at": "2026-01-01T00:10:00+00:00",
                "classification": "preempted",
                "reason": "spot interruption notice",
                "steps_lost": 1,
                "node_types": [
                    {"index": 0, "node_name": "n0", "instance_type": "g5.xlarge", "capacity_type": "spot"}
                ],
                "decision": {
                    "action": "relaunch",
                    "capacity": "on-demand",
                    "reason": "preemption 1 of at most 3: relaunching to resume",
                },
                "spec": {"env": {"AWS_SECRET_ACCESS_KEY": "SECRET-1"}},
            },
            {
                "attempt": 2,
                "capacity": "on-demand",
                "launched_at": "2026-01-01T00:11:00+00:00",
                "ended_at": "2026-01-01T00:20:00+00:00",
                "classification": "succeeded",
                "reason": "the trainer completed every step",
                "steps_lost": 0,
                "node_types": [],
                "decision": {"action": "finish", "capacity": "on-demand", "reason": "training completed"},
            },
        ],
        **extra,
    }


# Attempt 1 logs steps 1-6 and is preempted after the checkpoint at step 5; attempt 2 resumes
# and logs steps 6-10 (step 6 again, with another loss).
RUN_METRICS = metrics_jsonl(
    (1, 1, 4.0, 1000.0),
    (1, 2, 3.8, 3000.0),
    (1, 3, 3.5, 3100.0),
    (1, 4, 3.3, 3200.0),
    (1, 5, 3.1, 2900.0),
    (1, 6, 3.05, 3000.0),
    (2, 6, 3.0, 900.0),
    (2, 7, 2.9, 4000.0),
    (2, 8, 2.8, 4100.0),
    (2, 9, 2.6, 3900.0),
    (2, 10, 2.5, 4200.0),
)


def live_job(*, steps: int, every_s: float = 2.0) -> tuple[dict, list[dict], float]:
    """``(job.json, metrics records, the last step's time)`` of a run mid-training, as the
    training operator writes its record (:mod:`trainops.recovery.record`: started, one attempt
    launched and running, no ``state``, trainer ``record``, ``cost`` or end yet) and the trainer
    its records: ``steps`` steps of ``train.max_steps`` (the test's), one every ``every_s`` s,
    after a minute of startup."""
    launched = 1_767_225_600.0  # 2026-01-01T00:00:00Z
    job = start_record(
        run_uri=JOB_URI.rsplit("/", 1)[0],
        config_uri=JOB_URI.replace("job.json", "config.yaml"),
        cluster="local",
        capacity="spot",
        owner={"dag_id": "retrain", "run_id": "manual_1", "task_id": "train", "map_index": -1},
    )
    spec = JobSpec(name="train-0a1b2c3d-a1", args=["python", "-m", "trainer", "train"], nodes=2)
    handle = {"cluster": "local", "job_id": "train-0a1b2c3d-a1", "labels": {"trainops/attempt": "1"}}
    job = append_attempt(job, spec=spec, handle=handle, manifests=[], at="2026-01-01T00:00:00+00:00")
    records = [
        {
            "step": step,
            "attempt": 1,
            "loss": 5.0 - step / 100,
            "lr": 3e-4,
            "tokens_per_s": 1000.0,
            "time": launched + 60 + step * every_s,
        }
        for step in range(1, steps + 1)
    ]
    return dict(job), records, records[-1]["time"]
