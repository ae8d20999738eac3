"""Fencing: once a newer attempt has started, an older one may no longer commit a checkpoint.

A gang whose pods were force-removed can go on running, training and saving after the operator
launched the next attempt. Two objects of the run decide whether a commit is allowed, and both
are written only by compare-and-swap (If-Match / If-None-Match through the storage client: a
conditional write on S3, a write under an ``fcntl`` lock on ``file://``), so no check-then-write
race exists:

- ``checkpoints/latest.json`` carries the fence: ``fence`` lists every attempt that started,
  each with ``after_step``, the newest step committed when it started. An attempt raises the
  fence at startup, before it reads any checkpoint, and every ``latest.json`` write of a commit
  is a compare-and-swap that an attempt older than the newest raiser is refused.
- each ``step_<N>/_COMMITTED`` is written by compare-and-swap too: a marker written by a newer
  attempt is never replaced by an older one's.

A zombie may still slip a ``_COMMITTED`` in between its check and the fence going up; its
``latest.json`` write then fails, and readers ignore the marker: a marker by attempt ``a`` at a
step above the ``after_step`` of an attempt newer than ``a`` came after that attempt started
(:func:`void_reason`). The records here are pure and the decisions plain functions; the two
writers (:func:`raise_fence`, :func:`commit`) do the I/O.
"""

# No ``from __future__ import annotations``: TypedDict reads its annotations at run time.
import json
import logging
from typing import Any, NotRequired, TypedDict, cast

from trainer.checkpoint import commit as markers
from trainer.contract import RunLayout
from trainer.storage import NotFound, PreconditionFailed, Storage

log = logging.getLogger("trainer.checkpoint")

# Compare-and-swap rounds before giving up: each lost round means another writer moved the
# object meanwhile, and only the attempt's own gang and a newer attempt write these objects.
MAX_ROUNDS = 20


class Fenced(RuntimeError):
    """This attempt is older than the newest one that started: its commits are refused."""


class FenceEntry(TypedDict):
    """One attempt that started: ``after_step`` is the newest step committed at that moment."""

    attempt: int
    after_step: int


class Latest(TypedDict):
    """``checkpoints/latest.json``. ``attempt`` and ``fence`` are absent from older files."""

    step: int
    uri: str | None
    attempt: NotRequired[int]
    fence: NotRequired[list[FenceEntry]]


# --- pure decisions ---------------------------------------------------------------------------
def as_latest(data: object) -> Latest | None:
    """``data`` read from ``latest.json`` as a :class:`Latest`; None for anything else (an
    unreadable pointer holds no fence and is rewritten by the next commit)."""
    if not isinstance(data, dict) or not isinstance(data.get("step"), int):
        return None
    fence = data.get("fence", [])
    if not isinstance(fence, list) or not all(
        isinstance(e, dict) and isinstance(e.get("attempt"), int) and isinstance(e.get("after_step"), int)
        for e in fence
    ):
        return None
    return cast(Latest, data)


def fence_of(latest: Latest | None) -> list[FenceEntry]:
    return list(latest.get("fence", [])) if latest is not None else []


def newest_attempt(fence: list[FenceEntry]) -> int:
    """The newest attempt that raised the fence (0: none did)."""
    return max((e["attempt"] for e in fence), default=0)


def refusal(fence: list[FenceEntry], attempt: int) -> str | None:
    """Why ``attempt`` may not commit under ``fence``, or None when it may."""
    newest = newest_attempt(fence)
    if newest > attempt:
        return (
            f"attempt {attempt} is fenced: attempt {newest} started after it, so this gang is stale "
            "(its pods were probably force-removed) and its checkpoint commits are refused"
        )
    return None


def void_reason(fence: list[FenceEntry], marker_attempt: int, step: int) -> str | None:
    """Why a ``_COMMITTED`` written by ``marker_attempt`` at ``step`` must be ignored, or None.

    It is void when an attempt newer than its writer had started before it was written: its
    step is above that attempt's ``after_step``. Markers written before attempts were numbered
    in them count as attempt 0.
    """
    for entry in fence:
        if entry["attempt"] > marker_attempt and step > entry["after_step"]:
            return (
                f"committed by attempt {marker_attempt} after attempt {entry['attempt']} had started "
                f"(the fence allows attempt {marker_attempt} no commit after step {entry['after_step']})"
            )
    return None


def raised(latest: Latest | None, attempt: int, after_step: int) -> Latest:
    """``latest.json`` with ``attempt`` added to the fence."""
    base = cast(Latest, dict(latest)) if latest is not None else Latest(step=0, uri=None)
    base["fence"] = [*fence_of(latest), {"attempt": int(attempt), "after_step": int(after_step)}]
    return base


def advanced(latest: Latest | None, step: int, uri: str, attempt: int) -> Latest:
    """``latest.json`` after ``attempt`` committed ``step`` at ``uri``; the fence is kept."""
    out: Latest = {"step": int(step), "uri": uri, "attempt": int(attempt)}
    if latest is not None and "fence" in latest:
        out["fence"] = list(latest["fence"])
    return out


def marker_attempt(marker: object) -> int:
    """The attempt that wrote a ``_COMMITTED`` (0: written before markers named it)."""
    value = marker.get("attempt") if isinstance(marker, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


# --- I/O --------------------------------------------------------------------------------------
def read_object(storage: Storage, uri: str) -> tuple[object, str | None]:
    """The JSON at ``uri`` (None if it does not parse) and its etag; ``(None, None)`` if absent."""
    try:
        data, etag = storage.get_with_etag(uri)
    except NotFound:
        return None, None
    try:
        return json.loads(data), etag
    except ValueError:
        return None, etag


def read_latest(storage: Storage, layout: RunLayout) -> tuple[Latest | None, str | None]:
    """``latest.json`` and its etag (None, None when there is none)."""
    data, etag = read_object(storage, layout.latest)
    return as_latest(data), etag


def _put(storage: Storage, uri: str, document: Any, etag: str | None) -> None:
    """Write ``document`` only if ``uri`` still has ``etag`` (None: only if it does not exist)."""
    if etag is None:
        storage.put_json(uri, document, if_none_match=True)
    else:
        storage.put_json(uri, document, if_match=etag)


def newest_committed_step(storage: Storage, layout: RunLayout, fence: list[FenceEntry]) -> int:
    """The newest step with a ``_COMMITTED`` that ``fence`` does not void (0: none)."""
    by_step = markers.group_by_step(storage.list(layout.checkpoints), layout.checkpoints)
    for step in markers.newest_first(s for s, files in by_step.items() if markers.COMMITTED in files):
        marker, _ = read_object(storage, layout.committed_marker(step))
        if void_reason(fence, marker_attempt(marker), step) is None:
            return step
    return 0


def raise_fence(storage: Storage, layout: RunLayout, attempt: int) -> Latest:
    """Record in ``latest.json`` that ``attempt`` started; from now on older attempts' commits
    are refused. Raises :class:`Fenced` when a newer attempt already started.

    Idempotent: an attempt already in the fence (a retried start) changes nothing.
    """
    for _ in range(MAX_ROUNDS):
        latest, etag = read_latest(storage, layout)
        fence = fence_of(latest)
        why = refusal(fence, attempt)
        if why is not None:
            raise Fenced(why)
        if any(e["attempt"] == attempt for e in fence):
            return cast(Latest, latest)
        after = max(newest_committed_step(storage, layout, fence), latest["step"] if latest else 0)
        document = raised(latest, attempt, after)
        try:
            _put(storage, layout.latest, document, etag)
        except PreconditionFailed:
            continue  # a commit or another attempt moved it meanwhile: decide again
        log.info("fence: attempt %d started; older attempts may commit no step after %d", attempt, after)
        return document
    raise RuntimeError(
        f"{layout.latest} changed {MAX_ROUNDS} times while attempt {attempt} raised its fence; "
        "another process keeps writing it: make sure only one attempt of this run is running"
    )


def _put_marker(storage: Storage, layout: RunLayout, step: int, marker: dict[str, Any], attempt: int) -> None:
    """Write ``step``'s ``_COMMITTED`` unless a newer attempt's marker is there."""
    uri = layout.committed_marker(step)
    for _ in range(MAX_ROUNDS):
        current, etag = read_object(storage, uri)
        owner = marker_attempt(current)
        if etag is not None and owner > attempt:
            raise Fenced(
                f"attempt {attempt} is fenced: attempt {owner} already committed step {step}, and a "
                "commit is never replaced by an older attempt's"
            )
        try:
            _put(storage, uri, marker, etag)
            return
        except PreconditionFailed:
            continue
    raise RuntimeError(f"{uri} changed {MAX_ROUNDS} times while attempt {attempt} committed step {step}")


def commit(storage: Storage, layout: RunLayout, step: int, marker: dict[str, Any], attempt: int) -> Latest:
    """Commit ``step``: its ``_COMMITTED`` (``marker``), then ``latest.json``, both fenced.

    Raises :class:`Fenced` (and writes nothing more) as soon as a newer attempt is seen.
    :return: the ``latest.json`` written.
    """
    latest, etag = read_latest(storage, layout)
    why = refusal(fence_of(latest), attempt)
    if why is not None:
        raise Fenced(f"{why}; checkpoint step {step} was not committed")
    _put_marker(storage, layout, step, marker, attempt)
    for _ in range(MAX_ROUNDS):
        document = advanced(latest, step, layout.checkpoint(step), attempt)
        try:
            _put(storage, layout.latest, document, etag)
            return document
        except PreconditionFailed:
            latest, etag = read_latest(storage, layout)
            why = refusal(fence_of(latest), attempt)
            if why is not None:
                # Its marker stays valid only if the new attempt saw it when it started (and so
                # resumes from it); otherwise every reader ignores it (void_reason).
                raise Fenced(f"{why}; {layout.latest} was not moved to step {step}") from None
    raise RuntimeError(
        f"{layout.latest} changed {MAX_ROUNDS} times while attempt {attempt} committed step {step}"
    )
