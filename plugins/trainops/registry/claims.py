"""Version claims: who took a version number, and what becomes of a promotion that died.

::

    <root>/models/<name>/versions/<v>/_claim.json
        {"model", "version", "run_uri", "claimed_at", "token", ...}

A promotion claims the next number by creating ``_claim.json`` with If-None-Match (so each
number has one claim), copies the export into the version's folder, writes ``card.json`` (every
reader requires it: a version without it is incomplete) and then moves the pointer. A promotion
killed on the way (``kill -9``, a lost node) leaves a claim, part of the weights and no pointer
move: an *interrupted* version. Nothing else would ever remove it, so the next promotion of the
model sweeps them before it claims a number (:func:`sweep_interrupted`):

- its own (the claim names its run, so it is an earlier try of this promotion, and Airflow runs
  one try of a task at a time) at once; it takes the number over, so a retried promotion is
  published under the number its first try claimed and version numbers stay gap-free;
- another run's once nothing has happened to the claim for :data:`STALE_AFTER_S` (a promotion
  copies for minutes, never for hours, so a live one is not swept): its files are deleted and the
  claim kept as a tombstone with ``abandoned_at`` and the reason, as a promotion that failed keeps
  its own, so the number is not reused and the listing says why it holds no model.

A version the pointer names (production, or anywhere in its history), a claim of another model
and a claim already abandoned are never swept. A sweep first takes the claim by compare-and-swap
(If-Match on the etag read), so two sweepers never work on one version, and it deletes the claim
only after every other file, so no new claim of the number can see its files deleted. The claim
records a random ``token``; a promotion checks it is still its own just before it moves the
pointer (:func:`check_still_claimed`), so a promotion whose claim was swept never publishes.

:func:`interrupted` is the pure decision; the rest is storage I/O.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from trainer.contract import join, model_prefix, model_version_prefix
from trainer.storage import NotFound, PreconditionFailed, Storage
from trainops.registry.errors import PromotionError
from trainops.registry.pointer import Pointer, name_conflict, names_version

__all__ = [
    "CLAIM_NAME",
    "STALE_AFTER_S",
    "ClaimLost",
    "Claimed",
    "allocate_version",
    "check_claims_owner",
    "check_still_claimed",
    "claim_version",
    "interrupted",
    "next_version",
    "sweep_interrupted",
    "version_numbers",
]

CLAIM_NAME = "_claim.json"
# How long a claim of another run may show no sign of life before its version counts as
# interrupted. Promotions copy server-side or on one file system: minutes even for the largest
# exports, so six hours never catches a live one.
STALE_AFTER_S = 6 * 3600
_MAX_ALLOCATE_TRIES = 100

log = logging.getLogger(__name__)

# (version number, the claim's token): a version this promotion holds.
Claimed = tuple[int, str]


def _now() -> datetime:
    return datetime.now(UTC)


def _stamp(at: datetime) -> str:
    return at.isoformat(timespec="seconds")


def _time(value: object) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        at = datetime.fromisoformat(value)
    except ValueError:
        return None
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


# ------------------------------------------------------------------------- pure decisions


def next_version(existing_version_numbers: Iterable[int | str]) -> int:
    """The version after the highest existing one; 1 for a new model."""
    return max((int(v) for v in existing_version_numbers), default=0) + 1


def interrupted(
    claim: object,
    *,
    version: int,
    name: str,
    pointer: Pointer | None,
    run_uri: str | None,
    now: datetime,
) -> str | None:
    """Why version ``version`` (with ``claim``) counts as interrupted, or None when it does not.

    :param pointer: the model's pointer as read just before (None: none yet).
    :param run_uri: the run of the promotion that asks; its own earlier claim is interrupted at once.
    """
    if not isinstance(claim, dict) or claim.get("abandoned_at") or names_version(pointer, version):
        return None
    if claim.get("model") not in (None, name):
        return None  # another model's: never touched here
    swept = _time(claim.get("swept_at"))
    by_me = run_uri is not None and claim.get("swept_by") == run_uri  # an earlier try of mine died sweeping
    if swept is not None and (now - swept).total_seconds() < STALE_AFTER_S and not by_me:
        return None  # another promotion is sweeping it right now
    claimed = claim.get("run_uri")
    if run_uri is not None and claimed == run_uri:
        return (
            f"interrupted: an earlier try of this promotion (run {run_uri}) claimed v{version} at "
            f"{claim.get('claimed_at')} and never moved the pointer"
        )
    since = _time(claim.get("claimed_at"))
    if since is None or (now - since).total_seconds() < STALE_AFTER_S:
        return None
    return (
        f"interrupted: the promotion of run {claimed} claimed v{version} at {claim.get('claimed_at')} "
        f"and never moved the pointer (no sign of it for over {STALE_AFTER_S // 3600} hours)"
    )


# ------------------------------------------------------------------------- storage I/O


def _versions_prefix(root: str, name: str) -> str:
    return join(model_prefix(root, name), "versions")


def _version_of(versions_prefix: str, uri: str) -> int | None:
    rest = uri[len(versions_prefix) + 1 :] if uri.startswith(versions_prefix + "/") else ""
    head = rest.split("/", 1)[0]
    return int(head) if head.isdigit() else None


def version_numbers(storage: Storage, root: str, name: str) -> list[int]:
    """Every version number that has an object under ``versions/`` (claimed or complete)."""
    prefix = _versions_prefix(root, name)
    found = {_version_of(prefix, uri) for uri in storage.list(prefix)}
    return sorted(v for v in found if v is not None)


def _claim_body(name: str, version: int, claim: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "model": name,
        "claimed_at": _stamp(_now()),
        **(claim or {}),
        "version": version,
        "token": uuid.uuid4().hex,
    }


def allocate_version(storage: Storage, root: str, name: str, *, claim: dict[str, Any] | None = None) -> int:
    """Claim the next free version number by creating its ``_claim.json`` (If-None-Match)."""
    return _allocate(storage, root, name, claim)[0]


def _allocate(storage: Storage, root: str, name: str, claim: dict[str, Any] | None) -> Claimed:
    version = next_version(version_numbers(storage, root, name))
    for _ in range(_MAX_ALLOCATE_TRIES):
        body = _claim_body(name, version, claim)
        try:
            storage.put_json(
                join(model_version_prefix(root, name, version), CLAIM_NAME), body, if_none_match=True
            )
            return version, body["token"]
        except PreconditionFailed:
            version += 1
    raise PromotionError(
        f"could not claim a version of {name!r} after {_MAX_ALLOCATE_TRIES} tries "
        f"(last v{version}); too many promotions at once, retry later"
    )


def check_claims_owner(storage: Storage, root: str, name: str) -> None:
    """Refuse (:class:`~trainops.registry.errors.RegistryNameConflict`) a registry folder
    without a pointer whose newest claim records another model: before #25 two names could share
    a folder, and the newest claim says whose it is. Costs one listing and one read."""
    numbers = version_numbers(storage, root, name)
    if not numbers:
        return
    uri = join(model_version_prefix(root, name, numbers[-1]), CLAIM_NAME)
    try:
        claim = storage.get_json(uri)
    except (NotFound, ValueError):
        return
    recorded = claim.get("model") if isinstance(claim, dict) else None
    if isinstance(recorded, str) and recorded != name:
        raise name_conflict(uri, name=name, recorded=recorded)


def _read_claim(storage: Storage, uri: str) -> tuple[object, str] | None:
    try:
        data, etag = storage.get_with_etag(uri)
    except NotFound:
        return None
    try:
        return json.loads(data), etag
    except ValueError:
        return None  # not a claim this code wrote: left alone


def _sweep(
    storage: Storage,
    version_uri: str,
    claim: dict[str, Any],
    etag: str,
    *,
    reason: str,
    run_uri: str | None,
    take: dict[str, Any] | None,
) -> bool:
    """Sweep one interrupted version: take its claim (If-Match), delete its other files, then
    the claim and whatever a killed write left, then write ``take`` (the new claim of this
    promotion) or, when None, the tombstone. False when another promotion acted first."""
    claim_uri = join(version_uri, CLAIM_NAME)
    try:
        storage.put_json(claim_uri, {**claim, "swept_at": _stamp(_now()), "swept_by": run_uri}, if_match=etag)
    except PreconditionFailed:
        return False
    for uri in storage.list(version_uri):
        if uri != claim_uri:
            storage.delete(uri)
    # The claim goes last: until it does, no promotion can claim the number and write files
    # that this sweep would delete.
    storage.delete_prefix(version_uri)
    tombstone = {**claim, "abandoned_at": _stamp(_now()), "reason": reason, "swept_by": run_uri}
    new = take if take is not None else tombstone
    try:
        storage.put_json(claim_uri, new, if_none_match=True)
    except PreconditionFailed:
        return False  # a new promotion claimed the free number meanwhile: it is that one's now
    return True


def sweep_interrupted(
    storage: Storage, root: str, name: str, *, pointer: Pointer | None, claim: dict[str, Any]
) -> Claimed | None:
    """Sweep the interrupted versions of ``name`` (see the module docstring).

    :param pointer: the model's pointer as read just before (its versions are never touched).
    :param claim: what this promotion records in a claim (its ``run_uri``).
    :returns: the version this promotion took over (its own earlier try's), or None.
    """
    run_uri = claim.get("run_uri")
    prefix = _versions_prefix(root, name)
    listed: dict[int, list[str]] = {}
    for uri in storage.list(prefix):
        version = _version_of(prefix, uri)
        if version is not None:
            listed.setdefault(version, []).append(uri)
    taken: Claimed | None = None
    for version in sorted(listed):
        version_uri = model_version_prefix(root, name, version)
        if join(version_uri, CLAIM_NAME) not in listed[version] or names_version(pointer, version):
            continue
        read = _read_claim(storage, join(version_uri, CLAIM_NAME))
        if read is None:
            continue
        found, etag = read
        why = interrupted(found, version=version, name=name, pointer=pointer, run_uri=run_uri, now=_now())
        if why is None or not isinstance(found, dict):
            continue
        mine = taken is None and run_uri is not None and found.get("run_uri") == run_uri
        take = _claim_body(name, version, claim) if mine else None
        if not _sweep(storage, version_uri, found, etag, reason=why, run_uri=run_uri, take=take):
            continue
        log.warning(
            "%s v%d: %s; %s",
            name,
            version,
            why,
            "this promotion takes the number over" if take else "its files were deleted, its claim kept",
        )
        if take is not None:
            taken = version, take["token"]
    return taken


def claim_version(
    storage: Storage, root: str, name: str, *, pointer: Pointer | None, claim: dict[str, Any]
) -> Claimed:
    """Sweep the interrupted versions, then hold a version: this promotion's own earlier one
    when it finds it, else the next free number."""
    taken = sweep_interrupted(storage, root, name, pointer=pointer, claim=claim)
    return taken if taken is not None else _allocate(storage, root, name, claim)


class ClaimLost(PromotionError):
    """The claim of the version this promotion copied is no longer its own: another promotion
    swept it as interrupted. Nothing of it is this promotion's to publish or delete."""


def check_still_claimed(storage: Storage, root: str, name: str, claimed: Claimed) -> None:
    """Raise :class:`ClaimLost` unless the claim of ``claimed`` is still the one this promotion
    wrote (its token); read just before the pointer is moved."""
    version, token = claimed
    uri = join(model_version_prefix(root, name, version), CLAIM_NAME)
    try:
        found = storage.get_json(uri)
    except NotFound:
        found = None
    if isinstance(found, dict) and found.get("token") == token and not found.get("abandoned_at"):
        return
    raise ClaimLost(
        f"v{version} of {name!r} is no longer this promotion's: its claim {uri} was taken by another "
        f"promotion, which found no sign of this one for {STALE_AFTER_S // 3600} hours and swept the "
        "version as interrupted; nothing was published. Run the promotion again"
    )
