"""Promotion: copy an export into a numbered model version and move the production pointer.

Layout (from :mod:`trainer.contract`)::

    <root>/models/<name>/versions/<v>/_claim.json   who took version v (written once)
    <root>/models/<name>/versions/<v>/...           the export's files, copied
    <root>/models/<name>/versions/<v>/card.json     lineage
    <root>/models/<name>/versions/<v>/README.md     the card as a Hugging Face model card
    <root>/models/<name>/production.json            the pointer, moved only by compare-and-swap

Conditional writes are the only coordination: ``_claim.json`` with If-None-Match makes
version numbers unique, and the pointer is moved by :func:`trainops.registry.pointer.move_pointer`
only while it still names the version the gate checked against, so of two promotions gated
against the same production version exactly one wins. The other learns that production
moved; with a ``regate`` callable it checks the candidate against the new production model
and either moves the pointer from there (another compare-and-swap) or stops. Every move
appends to the pointer's ``history``, which is rewritten whole under the same
compare-and-swap, so no move is lost.

A promotion knows what it did, and deletes nothing that a pointer names. Its pointer move is
recognised in the history (:func:`trainops.registry.pointer.move_pointer`), so a write whose
reply was lost is not taken for a rival's. A promotion that fails after claiming its version
abandons it (deletes its files, keeps the claim) only after reading the pointer again and
finding the version named nowhere in it; if the pointer records the promotion after all, it
is reported as done; if the pointer cannot be read, the files are kept.

A promotion that was killed (no exception to handle) leaves an interrupted version; the next
promotion of the model sweeps it, and a retry of the same promotion takes its number over
(:mod:`trainops.registry.claims`). A registry belongs to one model: a pointer or a newest claim
recording another model's name is refused before anything is written.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import trainops
from trainer.contract import check_name, join, model_version_prefix, production_pointer
from trainer.storage import NotFound, Storage
from trainops.registry.claims import (
    CLAIM_NAME,
    Claimed,
    ClaimLost,
    allocate_version,
    check_claims_owner,
    check_still_claimed,
    claim_version,
    next_version,
    version_numbers,
)
from trainops.registry.errors import ProductionMovedError, PromotionError, RegateRejected
from trainops.registry.model_readme import README_NAME, render
from trainops.registry.pointer import (
    HistoryEntry,
    Move,
    Moved,
    Pointer,
    find_move,
    move_pointer,
    names_version,
    new_pointer,
    read_pointer,
    read_production,
)

__all__ = [
    "CARD_FORMAT",
    "ProductionMovedError",
    "PromotionError",
    "RegateRejected",
    "allocate_version",
    "card_uri",
    "config_sha256",
    "next_version",
    "promote",
    "read_config_bytes",
    "read_production",
    "version_numbers",
]

CARD_FORMAT = "trainops.model-card/v1"
CARD_NAME = "card.json"
# Names promotion writes into a version folder: an export holding one of them is refused.
RESERVED_NAMES = (CLAIM_NAME, CARD_NAME, README_NAME)
# How often one promotion may find production moved and re-gate before it gives up.
_MAX_REGATES = 20

log = logging.getLogger(__name__)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _trainops_version() -> str:
    return getattr(trainops, "__version__", "0.1.0")


# ------------------------------------------------------------------------- pure decisions


def _is_promotion(run_uri: str | None, version: int) -> Callable[[HistoryEntry], bool]:
    """Recognises the history entry of the promotion of ``version`` (from ``run_uri``).

    A version number is claimed by one promotion only, so the version identifies the move;
    the run is checked as well when there is one.
    """

    def recorded(entry: HistoryEntry) -> bool:
        return (
            entry.get("action") == "promote"
            and entry.get("version") == version
            and (run_uri is None or entry.get("run_uri") == run_uri)
        )

    return recorded


def _promotion_of(pointer: Pointer | None, run_uri: str | None) -> Moved | None:
    """This run's promotion as the history records it (the first one), if there is one."""
    if not pointer or not run_uri:
        return None
    history = pointer.get("history") or []
    for i, entry in enumerate(history):
        if entry.get("action") == "promote" and entry.get("run_uri") == run_uri:
            previous = history[i - 1]["version"] if i else None
            return {"entry": entry, "previous_version": previous, "pointer": pointer, "found": True}
    return None


# ------------------------------------------------------------------------- storage I/O


def card_uri(root: str, name: str, version: int) -> str:
    return join(model_version_prefix(root, name, version), CARD_NAME)


def read_config_bytes(storage: Storage, config_uri: str) -> bytes:
    """The resolved trainer config (``config.yaml``) of a run; a clear error when missing."""
    try:
        return storage.get(config_uri)
    except NotFound:
        raise PromotionError(
            f"trainer config {config_uri!r} does not exist; pass the training result of the run "
            "that produced this export"
        ) from None


def config_sha256(storage: Storage, config_uri: str) -> str:
    """sha256 of the resolved trainer config (``config.yaml``) bytes, as hex."""
    return hashlib.sha256(read_config_bytes(storage, config_uri)).hexdigest()


def _check_unmoved(pointer: Pointer | None, name: str, expected: int | None) -> int | None:
    current = pointer["version"] if pointer else None
    if current != expected:
        raise ProductionMovedError(name, expected, current, pointer=pointer)
    return current


def _copy_export(storage: Storage, export_uri: str, version_uri: str) -> list[dict[str, Any]]:
    base = export_uri.rstrip("/")
    sources = storage.list(base)
    if not sources:
        raise PromotionError(f"export {export_uri!r} holds no files; nothing to promote")
    files = []
    for src in sources:
        rel = src[len(base) + 1 :]
        if rel in RESERVED_NAMES:
            raise PromotionError(
                f"export {export_uri!r} contains {rel!r}, a name promotion reserves; rename it"
            )
        storage.copy(src, join(version_uri, rel))
        head = storage.head(src) or {}
        files.append({"path": rel, "size": head.get("size")})
    return files


def _abandon(storage: Storage, pointer: Pointer | None, version: int, version_uri: str, reason: str) -> bool:
    """Remove a version's files, keeping its claim (with the reason) so its number is never
    reused; refused (False, nothing deleted) when ``pointer``, read just before, names it."""
    if names_version(pointer, version):
        return False
    claim_uri = join(version_uri, CLAIM_NAME)
    for uri in storage.list(version_uri):
        if uri != claim_uri:
            storage.delete(uri)
    try:
        claim = storage.get_json(claim_uri)
    except NotFound:
        claim = {}
    storage.put_json(
        claim_uri, {**(claim if isinstance(claim, dict) else {}), "abandoned_at": _now(), "reason": reason}
    )
    return True


def _after_failure(
    storage: Storage,
    root: str,
    name: str,
    version: int,
    run_uri: str | None,
    regates: list[dict[str, Any]],
    exc: Exception,
) -> dict[str, Any] | None:
    """The promotion of ``version`` failed with ``exc``: read the pointer again, and abandon
    the version only if the pointer names it nowhere.

    Returns the promotion's result when the pointer records it after all (its write took
    effect although the call failed); None when the caller is to raise ``exc``: the version
    was abandoned, or its files were kept because the pointer could not be read.
    """
    version_uri = model_version_prefix(root, name, version)
    try:
        pointer = read_pointer(storage, production_pointer(root, name), model=name)[0]
    except Exception as read_exc:
        log.warning(
            "promotion of %s v%d failed, and its files under %s are kept: the production pointer "
            "could not be read to make sure that nothing names v%d (%s)",
            name,
            version,
            version_uri,
            version,
            read_exc,
        )
        return None
    done = find_move(pointer, _is_promotion(run_uri, version))
    if done is not None:
        log.warning(
            "promotion of %s v%d raised (%s), but the production pointer records it", name, version, exc
        )
        return _result(root, name, version, done, regates=regates)
    try:
        _abandon(storage, pointer, version, version_uri, str(exc) or type(exc).__name__)
    except Exception as abandon_exc:
        log.warning(
            "promotion of %s v%d failed; abandoning it (deleting its files, marking its claim) "
            "stopped part way: %s",
            name,
            version,
            abandon_exc,
        )
    return None


def promote(
    storage: Storage,
    root: str,
    name: str,
    *,
    export_uri: str,
    card: dict[str, Any],
    expected_production_version: int | None,
    regate: Callable[[Pointer | None], dict[str, Any]] | None = None,
    by: str | None = None,
) -> dict[str, Any]:
    """Publish ``export_uri`` as the next version of ``name`` and make it production.

    ``by`` (who or what promotes) goes into the pointer history's entry, as a rollback's does.

    ``card`` holds the caller's lineage (dataset, run, config hash, metrics, gate decision);
    the version, file list, trainops version and time are added here.
    ``expected_production_version`` is the version the gate compared against. If production
    is anything else when the pointer is moved:

    - without ``regate``, :class:`ProductionMovedError` is raised and the pointer is left
      untouched;
    - with ``regate``, it is called with the pointer as now read. It returns a record of the
      new comparison (kept in the card's ``gate.regates``), and the pointer is moved from
      that version instead; or it raises a :class:`PromotionError` (:class:`RegateRejected`,
      :class:`ProductionMovedError`) to stop.

    A version claimed and then not promoted keeps only its ``_claim.json``, with the reason,
    once the pointer is known not to name it (see the module docstring). Interrupted versions
    (of a killed promotion) are swept first, and a retry takes its own over
    (:mod:`trainops.registry.claims`). A run already promoted (a task retry after the pointer
    moved) is reported, not promoted again. The result's ``production_version`` is the version
    in production as last read: another one when production moved on after this promotion.

    Refused before anything is written: a ``name`` that is not a name (ValueError,
    :func:`trainer.contract.check_name`), and a registry folder whose pointer (or, with no
    pointer, newest claim) records another model
    (:class:`~trainops.registry.errors.RegistryNameConflict`, naming both).
    """
    check_name(name, "model name")
    pointer_uri = production_pointer(root, name)
    run_uri = card.get("run_uri")
    pointer = read_pointer(storage, pointer_uri, model=name)[0]
    if pointer is None:
        check_claims_owner(storage, root, name)
    done = _promotion_of(pointer, run_uri)
    if done is not None:
        return _result(root, name, done["entry"]["version"], done, regates=[])
    expected = expected_production_version
    regates: list[dict[str, Any]] = []
    try:
        # Decide before copying weights when the answer is already known.
        _check_unmoved(pointer, name, expected)
    except ProductionMovedError as moved:
        if regate is None:
            raise
        regates.append(regate(moved.pointer))
        expected = moved.current_version

    claimed: Claimed = claim_version(storage, root, name, pointer=pointer, claim={"run_uri": run_uri})
    version = claimed[0]
    version_uri = model_version_prefix(root, name, version)
    try:
        files = _copy_export(storage, export_uri, version_uri)
        for _ in range(_MAX_REGATES):
            at = _now()
            written = _card(
                card,
                regates,
                name=name,
                version=version,
                version_uri=version_uri,
                export_uri=export_uri,
                files=files,
                at=at,
            )
            storage.put_json(join(version_uri, CARD_NAME), written)
            storage.put(join(version_uri, README_NAME), render(written).encode("utf-8"))
            check_still_claimed(storage, root, name, claimed)
            try:
                made = _move_pointer(
                    storage,
                    pointer_uri,
                    name,
                    expected,
                    version=version,
                    version_uri=version_uri,
                    entry=_entry(at, run_uri, by),
                )
            except ProductionMovedError as lost:
                if regate is None:
                    raise
                regates.append(regate(lost.pointer))
                expected = lost.current_version
                continue
            return _result(root, name, version, made, regates=regates)
        raise PromotionError(
            f"production of {name!r} moved {_MAX_REGATES} times while this promotion re-gated "
            "against it; too many promotions at once, retry later"
        )
    except ClaimLost:
        raise  # the version is another promotion's now: nothing here to abandon
    except Exception as exc:
        result = _after_failure(storage, root, name, version, run_uri, regates, exc)
        if result is not None:
            return result
        raise


def _entry(at: str, run_uri: str | None, by: str | None) -> Move:
    entry: Move = {"at": at, "action": "promote", "run_uri": run_uri}
    if by:
        entry["by"] = by
    return entry


def _card(
    card: dict[str, Any],
    regates: list[dict[str, Any]],
    *,
    name: str,
    version: int,
    version_uri: str,
    export_uri: str,
    files: list[dict[str, Any]],
    at: str,
) -> dict[str, Any]:
    gate = dict(card.get("gate") or {})
    if regates:
        gate["regates"] = regates
    return {
        **card,
        "gate": gate,
        "format": CARD_FORMAT,
        "model": name,
        "version": version,
        "uri": version_uri,
        "export_uri": export_uri,
        "files": files,
        "trainops_version": _trainops_version(),
        "promoted_at": at,
    }


def _result(
    root: str, name: str, version: int, moved: Moved, *, regates: list[dict[str, Any]]
) -> dict[str, Any]:
    return {
        "version": version,
        "version_uri": model_version_prefix(root, name, version),
        "card_uri": card_uri(root, name, version),
        "production_uri": production_pointer(root, name),
        "previous_version": moved["previous_version"],
        "production_version": moved["pointer"]["version"],
        "regated_against": [r.get("production_version") for r in regates],
    }


def _move_pointer(
    storage: Storage,
    uri: str,
    name: str,
    expected: int | None,
    *,
    version: int,
    version_uri: str,
    entry: Move,
) -> Moved:
    """Make ``version`` production if production still is ``expected``, or find that an
    earlier try did (its reply lost; production may have moved on since)."""

    def decide(pointer: Pointer | None) -> Pointer:
        _check_unmoved(pointer, name, expected)
        return new_pointer(pointer, name=name, version=version, version_uri=version_uri, entry=entry)

    recorded = _is_promotion(entry.get("run_uri"), version)
    return move_pointer(storage, uri, decide, model=name, action="promotion", recorded=recorded)
