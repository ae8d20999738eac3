"""Promotion: copy an export into a numbered model version and move the production pointer.

Layout (from :mod:`trainer.contract`)::

    <root>/models/<name>/versions/<v>/_claim.json   who took version v (written once)
    <root>/models/<name>/versions/<v>/...           the export's files, copied
    <root>/models/<name>/versions/<v>/card.json     lineage
    <root>/models/<name>/production.json            the pointer, moved only by compare-and-swap

Conditional writes are the only coordination: ``_claim.json`` with If-None-Match makes
version numbers unique, and the pointer is written with If-Match on the etag that was
checked, so of two promotions gated against the same production version exactly one wins.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timezone

from trainer.contract import join, model_prefix, model_version_prefix, production_pointer
from trainer.storage import NotFound, PreconditionFailed, Storage

__all__ = [
    "CARD_FORMAT",
    "POINTER_FORMAT",
    "ProductionMovedError",
    "PromotionError",
    "allocate_version",
    "config_sha256",
    "next_version",
    "promote",
    "read_production",
    "version_numbers",
]

POINTER_FORMAT = "trainops.production/v1"
CARD_FORMAT = "trainops.model-card/v1"
CLAIM_NAME = "_claim.json"
CARD_NAME = "card.json"
_MAX_ALLOCATE_TRIES = 100
_MAX_CAS_TRIES = 20


class PromotionError(Exception):
    """Promotion could not proceed."""


class ProductionMovedError(PromotionError):
    """The production pointer changed after the gate compared against it."""

    def __init__(self, model: str, expected_version: int | None, current_version: int | None):
        self.model = model
        self.expected_version = expected_version
        self.current_version = current_version
        target = (f"against v{current_version}" if current_version is not None
                  else "with no production model")
        super().__init__(
            f"production of {model!r} moved from {_label(expected_version)} to "
            f"{_label(current_version)} while this run was gated; re-run to evaluate {target}"
        )


def _label(version: int | None) -> str:
    return f"v{version}" if version is not None else "(none)"


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _trainops_version() -> str:
    try:
        import trainops
    except ImportError:
        return "0.1.0"
    return getattr(trainops, "__version__", "0.1.0")


# ------------------------------------------------------------------------- pure decisions


def next_version(existing_version_numbers) -> int:
    """The version after the highest existing one; 1 for a new model."""
    return max((int(v) for v in existing_version_numbers), default=0) + 1


def _version_of(versions_prefix: str, uri: str) -> int | None:
    rest = uri[len(versions_prefix) + 1:] if uri.startswith(versions_prefix + "/") else ""
    head = rest.split("/", 1)[0]
    return int(head) if head.isdigit() else None


def _parse_pointer(data: object, uri: str) -> dict:
    if (not isinstance(data, dict) or not isinstance(data.get("version"), int)
            or isinstance(data.get("version"), bool)):
        raise PromotionError(
            f"production pointer {uri!r} is malformed (no integer 'version': {str(data)[:200]}); "
            "restore it from its history or delete it"
        )
    return data


def _new_pointer(previous: dict | None, *, name: str, version: int, version_uri: str,
                 run_uri: str | None, at: str) -> dict:
    history = list(previous.get("history", [])) if previous else []
    history.append({"version": version, "at": at, "action": "promote", "run_uri": run_uri})
    return {"format": POINTER_FORMAT, "model": name, "version": version, "uri": version_uri,
            "promoted_at": at, "run_uri": run_uri, "history": history}


# ------------------------------------------------------------------------- storage I/O


def version_numbers(storage: Storage, root: str, name: str) -> list[int]:
    """Every version number that has an object under ``versions/`` (claimed or complete)."""
    prefix = join(model_prefix(root, name), "versions")
    found = {_version_of(prefix, uri) for uri in storage.list(prefix)}
    return sorted(v for v in found if v is not None)


def allocate_version(storage: Storage, root: str, name: str, *,
                     claim: dict | None = None) -> int:
    """Claim the next free version number by creating its ``_claim.json`` (If-None-Match)."""
    version = next_version(version_numbers(storage, root, name))
    body = {"model": name, "claimed_at": _now(), **(claim or {})}
    for _ in range(_MAX_ALLOCATE_TRIES):
        uri = join(model_version_prefix(root, name, version), CLAIM_NAME)
        try:
            storage.put_json(uri, {**body, "version": version}, if_none_match=True)
            return version
        except PreconditionFailed:
            version += 1
    raise PromotionError(
        f"could not claim a version of {name!r} after {_MAX_ALLOCATE_TRIES} tries "
        f"(last v{version}); too many promotions at once, retry later"
    )


def read_production(storage: Storage, root: str, name: str) -> dict | None:
    """The production pointer of model ``name``, or None if it has never been promoted."""
    return _read_pointer(storage, production_pointer(root, name))[0]


def _read_pointer(storage: Storage, uri: str) -> tuple[dict | None, str | None]:
    try:
        data, etag = storage.get_with_etag(uri)
    except NotFound:
        return None, None
    try:
        obj = json.loads(data)
    except ValueError as exc:
        raise PromotionError(
            f"production pointer {uri!r} is not valid JSON ({exc}); restore it or delete it"
        ) from exc
    return _parse_pointer(obj, uri), etag


def config_sha256(storage: Storage, config_uri: str) -> str:
    """sha256 of the resolved trainer config (``config.yaml``) bytes, as hex."""
    try:
        data = storage.get(config_uri)
    except NotFound:
        raise PromotionError(
            f"trainer config {config_uri!r} does not exist; pass the training result of the run "
            "that produced this export"
        ) from None
    return hashlib.sha256(data).hexdigest()


def _check_unmoved(pointer: dict | None, name: str, expected: int | None) -> int | None:
    current = pointer["version"] if pointer else None
    if current != expected:
        raise ProductionMovedError(name, expected, current)
    return current


def _promoted_by(pointer: dict | None, run_uri: str | None, expected: int | None) -> bool:
    """Whether the pointer's latest move was this run's promotion from ``expected``."""
    if not pointer or not run_uri or pointer.get("run_uri") != run_uri:
        return False
    history = pointer.get("history") or []
    before = history[-2].get("version") if len(history) >= 2 else None
    return before == expected


def _copy_export(storage: Storage, export_uri: str, version_uri: str) -> list[dict]:
    base = export_uri.rstrip("/")
    sources = storage.list(base)
    if not sources:
        raise PromotionError(f"export {export_uri!r} holds no files; nothing to promote")
    files = []
    for src in sources:
        rel = src[len(base) + 1:]
        if rel in (CLAIM_NAME, CARD_NAME):
            raise PromotionError(
                f"export {export_uri!r} contains {rel!r}, a name promotion reserves; rename it"
            )
        storage.copy(src, join(version_uri, rel))
        head = storage.head(src) or {}
        files.append({"path": rel, "size": head.get("size")})
    return files


def _abandon(storage: Storage, version_uri: str, reason: str) -> None:
    """Remove a losing version's files but keep its claim, so its number is never reused."""
    claim_uri = join(version_uri, CLAIM_NAME)
    for uri in storage.list(version_uri):
        if uri != claim_uri:
            storage.delete(uri)
    try:
        claim = storage.get_json(claim_uri)
    except NotFound:
        claim = {}
    storage.put_json(claim_uri, {**(claim if isinstance(claim, dict) else {}),
                                 "abandoned_at": _now(), "reason": reason})


def promote(storage: Storage, root: str, name: str, *, export_uri: str, card: dict,
            expected_production_version: int | None) -> dict:
    """Publish ``export_uri`` as the next version of ``name`` and make it production.

    ``card`` holds the caller's lineage (dataset, run, config hash, metrics, gate decision);
    the version, file list, trainops version and time are added here.
    ``expected_production_version`` is the version the gate compared against: if production
    is anything else when the pointer is moved, :class:`ProductionMovedError` is raised and
    the pointer is left untouched.
    """
    pointer_uri = production_pointer(root, name)
    run_uri = card.get("run_uri")
    pointer = _read_pointer(storage, pointer_uri)[0]
    if _promoted_by(pointer, run_uri, expected_production_version):
        # A retry after the pointer moved but before the task could report it.
        return {"version": pointer["version"], "version_uri": pointer["uri"],
                "production_uri": pointer_uri, "previous_version": expected_production_version}
    # Fail before copying weights when the answer is already known.
    _check_unmoved(pointer, name, expected_production_version)

    version = allocate_version(storage, root, name, claim={"run_uri": run_uri})
    version_uri = model_version_prefix(root, name, version)
    try:
        files = _copy_export(storage, export_uri, version_uri)
        at = _now()
        storage.put_json(join(version_uri, CARD_NAME), {
            **card, "format": CARD_FORMAT, "model": name, "version": version,
            "uri": version_uri, "export_uri": export_uri, "files": files,
            "trainops_version": _trainops_version(), "promoted_at": at,
        })
        previous = _move_pointer(storage, pointer_uri, name, expected_production_version,
                                 version=version, version_uri=version_uri, run_uri=run_uri, at=at)
    except (PromotionError, NotFound) as exc:
        _abandon(storage, version_uri, str(exc))
        raise
    return {"version": version, "version_uri": version_uri, "production_uri": pointer_uri,
            "previous_version": previous}


def _move_pointer(storage: Storage, uri: str, name: str, expected: int | None, *,
                  version: int, version_uri: str, run_uri: str | None, at: str) -> int | None:
    for _ in range(_MAX_CAS_TRIES):
        pointer, etag = _read_pointer(storage, uri)
        previous = _check_unmoved(pointer, name, expected)
        new = _new_pointer(pointer, name=name, version=version, version_uri=version_uri,
                           run_uri=run_uri, at=at)
        condition = {"if_match": etag} if etag is not None else {"if_none_match": True}
        try:
            storage.put_json(uri, new, **condition)
            return previous
        except PreconditionFailed:
            # Someone wrote the pointer since we read it; the moved-check above decides.
            continue
    raise PromotionError(
        f"production pointer {uri!r} kept changing over {_MAX_CAS_TRIES} compare-and-swap tries; "
        "retry the promotion"
    )
