"""Rollback: point production back at a version that was production before.

The pointer moves through the same compare-and-swap as a promotion
(:func:`trainops.registry.pointer.move_pointer`), and the move joins the pointer's history
with who did it and why::

    {"version": 2, "action": "rollback", "from_version": 3, "by": "alice",
     "reason": "v3 answers in German", "at": "...", "run_uri": "<the run v2 came from>"}

Rules:

- The target must be a complete version (its ``card.json`` and every file the card lists)
  that was production before (it is in the pointer's history). Rolling back to a version
  that never went through the gate as production is refused: a rollback returns to a
  known state, it does not publish.
- Rolling back to the version that is already production changes nothing and says so, so
  a retried task or a repeated command is harmless.
- If another promotion or rollback moves production while this one runs, nothing is
  written and :class:`RollbackConflict` names the new version: the person rolling back
  decides again. A rewrite that does not move production is retried.
- The result says what happened. A write whose reply was lost is found in the history by its
  entry and reported as the change it made (``changed`` True), never as a conflict or as
  "nothing changed"; a write that failed with storage unavailable is looked for in the
  pointer the same way before the error is raised. When the version already is production,
  ``since`` is the history entry that made it so (a retried task finds its own earlier move
  there, by ``via``).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from trainer.contract import check_name, join, model_version_prefix, production_pointer
from trainer.storage import NotFound, Storage, StorageError
from trainops.registry.claims import version_numbers
from trainops.registry.errors import PromotionError, RollbackConflict
from trainops.registry.pointer import (
    HistoryEntry,
    Move,
    Moved,
    Pointer,
    Recorded,
    find_move,
    move_pointer,
    new_pointer,
    read_pointer,
)
from trainops.registry.promotion import CARD_NAME
from trainops.shapes import ShapeError, check_card, load

__all__ = ["RollbackConflict", "rollback"]


def _check_target(storage: Storage, root: str, name: str, version: int, pointer: Pointer) -> dict[str, Any]:
    """The target version's card, after checking it may be rolled back to."""
    history = pointer.get("history") or []
    been = sorted({h.get("version") for h in history if isinstance(h.get("version"), int)})
    if version not in been:
        existing = version_numbers(storage, root, name)
        if version not in existing:
            raise PromotionError(
                f"{name!r} has no version {version} (versions: "
                f"{', '.join(f'v{v}' for v in existing) or 'none'}); pick one of its history: "
                f"{', '.join(f'v{v}' for v in been)}"
            )
        raise PromotionError(
            f"v{version} of {name!r} was never production (history: "
            f"{', '.join(f'v{v}' for v in been)}); rollback only returns to a version that was "
            "production"
        )
    version_uri = model_version_prefix(root, name, version)
    card_uri = join(version_uri, CARD_NAME)
    try:
        card = load(storage.get(card_uri), card_uri, check_card)
    except NotFound:
        raise PromotionError(
            f"v{version} of {name!r} has no {CARD_NAME} at {version_uri}; its "
            "files are incomplete, so production cannot point at it"
        ) from None
    except ShapeError as exc:  # names the field: production is not pointed at a damaged card
        raise PromotionError(f"v{version} of {name!r}: {exc}") from None
    for item in card.get("files") or []:
        if storage.head(join(version_uri, item["path"])) is None:
            raise PromotionError(
                f"v{version} of {name!r} is missing {item['path']!r} under "
                f"{version_uri}; production cannot point at it"
            )
    return card


def _no_pointer(name: str, uri: str) -> PromotionError:
    return PromotionError(
        f"{name!r} has no production pointer at {uri}; nothing to roll "
        "back (check the model name and the storage root)"
    )


def _made_production(pointer: Pointer) -> HistoryEntry | None:
    """The history entry that made the current version production (the last one naming it)."""
    for entry in reversed(pointer.get("history") or []):
        if entry.get("version") == pointer["version"]:
            return entry
    return None


def rollback(
    storage: Storage, root: str, name: str, version: int, *, reason: str, by: str, via: str | None = None
) -> dict[str, Any]:
    """Move production of ``name`` back to ``version``; see the module docstring.

    Returns ``{"model", "version", "previous_version", "changed", "by", "reason", "at",
    "production_uri", "production_version"}``: ``changed`` True when this call moved
    production from ``previous_version`` to ``version`` (recorded at ``at``), False when
    ``version`` already was production, and then also ``since``, the history entry that made
    it production. ``production_version`` is the version in production as last read (another
    one only when a rival moved production on right after this rollback). Raises
    PromotionError (or :class:`RollbackConflict`) naming what is wrong, and StorageError when
    storage failed and the pointer does not show the move. A pointer that records another
    model's name is refused (:class:`~trainops.registry.errors.RegistryNameConflict`, naming
    both), and so is a ``name`` that is not one (ValueError).
    """
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise PromotionError(f"version must be a positive integer such as 2, got {version!r}")
    if not isinstance(reason, str) or not reason.strip():
        raise PromotionError(
            "a rollback needs a reason (for example --reason 'v3 regressed on "
            "support tickets'); it is kept in the pointer's history"
        )
    if not isinstance(by, str) or not by.strip():
        raise PromotionError("a rollback needs to say who does it (--by NAME)")
    check_name(name, "model name")
    uri = production_pointer(root, name)
    pointer = read_pointer(storage, uri, model=name)[0]
    if pointer is None:
        raise _no_pointer(name, uri)
    started_from = pointer["version"]
    at = datetime.now(UTC).isoformat(timespec="seconds")
    out = {
        "model": name,
        "version": version,
        "previous_version": started_from,
        "by": by.strip(),
        "reason": reason.strip(),
        "at": at,
        "production_uri": uri,
    }
    if started_from == version:
        return {**out, "changed": False, "production_version": version, "since": _made_production(pointer)}
    card = _check_target(storage, root, name, version, pointer)
    entry: Move = {
        "at": at,
        "action": "rollback",
        "from_version": started_from,
        "by": by.strip(),
        "reason": reason.strip(),
        "run_uri": card.get("run_uri"),
    }
    if via:
        entry["via"] = via
    ours: HistoryEntry = {"version": version, **entry}

    def decide(current_pointer: Pointer | None) -> Pointer:
        if current_pointer is None:
            raise _no_pointer(name, uri)
        current = current_pointer["version"]
        if current != started_from:
            raise RollbackConflict(
                f"production of {name!r} moved from v{started_from} to v{current} while rolling "
                f"back to v{version}; nothing was changed. Check v{current}, then run the "
                "rollback again if you still want it"
            )
        return new_pointer(
            current_pointer,
            name=name,
            version=version,
            version_uri=model_version_prefix(root, name, version),
            entry=entry,
        )

    def recorded(item: HistoryEntry) -> bool:
        return dict(item) == dict(ours)

    moved: Moved | None
    try:
        moved = move_pointer(storage, uri, decide, model=name, action="rollback", recorded=recorded)
    except StorageError:
        # In doubt (the storage client gave up after its write may have taken effect): the
        # pointer, if it can be read, tells.
        moved = _find_after_failure(storage, uri, name, recorded)
        if moved is None:
            raise
    return {
        **out,
        "previous_version": moved["previous_version"],
        "changed": True,
        "production_version": moved["pointer"]["version"],
    }


def _find_after_failure(storage: Storage, uri: str, name: str, recorded: Recorded) -> Moved | None:
    """The rollback in the pointer's history after its write failed, or None (not there, or
    the pointer cannot be read either)."""
    try:
        pointer = read_pointer(storage, uri, model=name)[0]
    except StorageError:
        return None
    return find_move(pointer, recorded)
