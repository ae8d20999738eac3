"""What lies around a report page (:class:`trainops.reports.frame.Around`): the run it belongs
to, that run's Airflow ids, whether it is live, and the model versions promoted from it.

Which objects are looked at is decided here; the app passes the reading in (``read``: a
storage URI to its parsed JSON, or None when it is missing, refused or unreadable; ``listing``:
a prefix to the URIs below it, [] when it cannot be listed), with the same root and link
checks as every report. Everything found here is an extra: a lookup that fails leaves a link
out and never the page.

- A run's ``job.json``: its ``airflow`` ids, live while ``status`` is ``running``, and, once
  it is not, the versions whose promotion in a production pointer names the run
  (``models/*/production.json`` under the run's storage root, the history's ``run_uri``).
- Any other object below ``runs/<dag>/<run>/<task>/`` (a gate decision, a config): the run's
  ``job.json`` beside it, for its Airflow ids and the link to its report.
- A model card (``card.json``): the run named by its ``run_uri``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from trainer.contract import join
from trainops.registry.promotion import card_uri
from trainops.reports.frame import Around, airflow_ref
from trainops.reports.pages import report_kind

__all__ = ["around_report", "promoted_from", "run_of_path"]

JOB_NAME = "job.json"
Read = Callable[[str], Any]
Listing = Callable[[str], list[str]]
Locate = Callable[[str], "tuple[str, str] | None"]


def run_of_path(root: str, relative: str) -> tuple[str, str, str] | None:
    """``(storage root, run prefix, dag segment)`` of the object at ``relative`` below the
    served ``root`` when it lies at or below a run's folder (``[<prefix>/]runs/<dag>/<run>/
    <task>/...``, the first ``runs`` segment, as the app's access check reads it), else None."""
    parts = relative.split("/")
    for i, part in enumerate(parts):
        if part == "runs" and len(parts) > i + 4 and all(parts[i + 1 : i + 4]):
            return join(root, *parts[:i]), join(root, *parts[: i + 4]), parts[i + 1]
    return None


def promoted_from(run_uri: str, root: str, read: Read, listing: Listing) -> list[tuple[str, int, str]]:
    """``(model, version, card URI)`` of each version whose promotion came from ``run_uri``,
    by the production pointers under ``root`` (the run's storage root)."""
    base = join(root, "models") + "/"
    found = []
    for uri in sorted(listing(base)):
        name, _, rest = uri[len(base) :].partition("/") if uri.startswith(base) else ("", "", "")
        if not name or rest != "production.json":
            continue
        pointer = read(uri)
        history = pointer.get("history") if isinstance(pointer, Mapping) else None
        for entry in history if isinstance(history, list) else []:
            if not isinstance(entry, Mapping) or entry.get("action") != "promote":
                continue
            version = entry.get("version")
            if entry.get("run_uri") == run_uri and isinstance(version, int) and not isinstance(version, bool):
                found.append((name, version, card_uri(root, name, version)))
    return sorted(set(found))


def around_report(
    target: tuple[str, str], report: object, read: Read, listing: Listing, locate: Locate
) -> Around:
    """What lies around the report at ``target`` (``(root, path below it)``) whose parsed
    content is ``report`` (None when it is not JSON). ``locate`` places another URI the same
    way, None when it may not be read."""
    root, relative = target
    run = run_of_path(root, relative)
    if run is not None:
        storage_root, run_uri, dag = run
        if relative.split("/")[-1] == JOB_NAME and join(root, relative) == join(run_uri, JOB_NAME):
            job = report if isinstance(report, Mapping) else None
            live = job is not None and job.get("status") == "running"
            # a live run has no promoted version yet: its reload every few seconds lists nothing
            cards = () if live else tuple(promoted_from(run_uri, storage_root, read, listing))
            return Around(airflow=airflow_ref(job, dag), cards=cards, live=live)
        return _run_beside(run_uri, dag, read)
    if isinstance(report, Mapping) and report_kind(relative, report) == "model_card":
        card_run_uri = report.get("run_uri")
        where = (
            locate(join(card_run_uri, JOB_NAME)) if isinstance(card_run_uri, str) and card_run_uri else None
        )
        card_run = run_of_path(*where) if where is not None else None
        if card_run is not None:
            return _run_beside(card_run[1], card_run[2], read)
    return Around()


def _run_beside(run_uri: str, dag: str, read: Read) -> Around:
    """The Around of a page about the run at ``run_uri`` that is not its report."""
    job = read(join(run_uri, JOB_NAME))
    job = job if isinstance(job, Mapping) else None
    return Around(airflow=airflow_ref(job, dag), run_report=join(run_uri, JOB_NAME) if job else None)
