"""The production pointer (``models/<name>/production.json``) and the one compare-and-swap
that moves it.

The pointer names the version in production and keeps the history of every move, rewritten
whole with each move. Promotion and rollback both move it through :func:`move_pointer`: read
the pointer with its etag, let the caller's ``decide`` turn the pointer as read into the new
one (a pure function; it raises to stop, and then nothing is written), and write the result
with If-Match on that etag (If-None-Match when there is no pointer yet). A write that loses
to another writer (PreconditionFailed) reads again and decides again, at most
:data:`MAX_CAS_TRIES` times. So a move never overwrites one it did not see, and none is lost.

A move knows what it did. Each try first looks for the move in the history of the pointer it
read (the caller says how to recognise it, :data:`Recorded`), and if it is there, returns it as
done instead of writing it again. The storage client recognises its own write after a lost
reply by the write token; this covers what the token cannot tell: the write took effect, its
reply was lost, and a rival moved the pointer on before the read-back, so that ``put`` raised
PreconditionFailed for a write that happened. It covers a retried task as well.

A pointer belongs to one model: it records the model's exact name (``model``), and every read
through :func:`read_pointer` with ``model`` (and every move) refuses a pointer that names another
model (:class:`~trainops.registry.errors.RegistryNameConflict`, naming both). A pointer with
no name (written by hand) is accepted, and the next move writes the name. :func:`parse_pointer`
is the one check of a pointer's shape: anything else raises
:class:`~trainops.registry.errors.MalformedPointer` (a ValueError) naming the file and the field.
"""

# No postponed annotations here: TypedDict tells required from NotRequired keys at run time
# only from evaluated annotations (``__required_keys__``).
import json
import logging
from collections.abc import Callable
from typing import TypedDict, cast

from trainer.contract import check_name, legacy_segment, production_pointer, safe_segment
from trainer.storage import NotFound, PreconditionFailed, Storage
from trainops.registry.errors import (
    HistoryEntry,
    LegacyRegistry,
    MalformedPointer,
    Move,
    Pointer,
    PromotionError,
    RegistryNameConflict,
)

__all__ = [
    "MAX_CAS_TRIES",
    "POINTER_FORMAT",
    "Decide",
    "HistoryEntry",
    "Move",
    "Moved",
    "Pointer",
    "Recorded",
    "check_owner",
    "find_move",
    "move_pointer",
    "name_conflict",
    "names_version",
    "new_pointer",
    "parse_pointer",
    "read_pointer",
    "read_production",
]

POINTER_FORMAT = "trainops.production/v1"
MAX_CAS_TRIES = 20

log = logging.getLogger(__name__)


# The pointer as read (None: there is none yet) -> the pointer to write; raises to stop.
Decide = Callable[[Pointer | None], Pointer]
# Whether a history entry is the move being made (so that a move already written is not repeated).
Recorded = Callable[[HistoryEntry], bool]


class Moved(TypedDict):
    """What a move did: the entry that records it, the version it replaced, the pointer after it."""

    entry: HistoryEntry
    previous_version: int | None  # None: the move created the pointer
    pointer: Pointer  # as written; or as read, when the move was found already recorded
    # True when the history already held the move (an earlier try or task whose reply was lost),
    # so this call wrote nothing; the pointer may have moved on since.
    found: bool


# ------------------------------------------------------------------------------ pure


def find_move(pointer: Pointer | None, recorded: Recorded) -> Moved | None:
    """The last entry of ``pointer``'s history that ``recorded`` recognises, as a :class:`Moved`
    (``found`` True, ``previous_version`` the entry before it); None when there is none."""
    history = (pointer.get("history") or []) if pointer else []
    for i in range(len(history) - 1, -1, -1):
        if recorded(history[i]):
            previous = history[i - 1]["version"] if i else None
            return {
                "entry": history[i],
                "previous_version": previous,
                "pointer": cast(Pointer, pointer),
                "found": True,
            }
    return None


def names_version(pointer: Pointer | None, version: int) -> bool:
    """Whether ``pointer`` names ``version``: in production now, or in any entry of its history
    (so a rollback may return to it, and its files must stay)."""
    if pointer is None:
        return False
    return pointer["version"] == version or any(
        entry.get("version") == version or entry.get("from_version") == version
        for entry in pointer.get("history") or []
    )


# The optional fields of a history entry and the types each may hold.
_ENTRY_FIELDS: dict[str, tuple[type, ...]] = {
    "at": (str,),
    "run_uri": (str, type(None)),
    "by": (str,),
    "reason": (str,),
    "via": (str,),
}


def _is_version(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _kind(value: object) -> str:
    return "null" if value is None else type(value).__name__


def _bad(uri: str, field: str, expected: str, got: str) -> MalformedPointer:
    return MalformedPointer(
        f"production pointer {uri}: field {field!r} must be {expected}, got {got}; restore the file "
        "from a backup, or delete it to start the model's production anew",
        field=field,
        expected=expected,
        got=got,
    )


def _check_entry(entry: object, uri: str, i: int) -> HistoryEntry:
    field = f"history[{i}]"
    if not isinstance(entry, dict):
        raise _bad(uri, field, "an object (one move)", f"{_kind(entry)} {str(entry)[:80]}")
    if not _is_version(entry.get("version")):
        raise _bad(uri, f"{field}.version", "a version number >= 1", f"{entry.get('version')!r}")
    if not isinstance(entry.get("action"), str):
        raise _bad(uri, f"{field}.action", "'promote' or 'rollback'", f"{entry.get('action')!r}")
    if "from_version" in entry and not _is_version(entry["from_version"]):
        raise _bad(uri, f"{field}.from_version", "a version number >= 1", f"{entry['from_version']!r}")
    for key, types in _ENTRY_FIELDS.items():
        if key in entry and not isinstance(entry[key], types):
            raise _bad(uri, f"{field}.{key}", "text", f"{_kind(entry[key])} {entry[key]!r}")
    return cast(HistoryEntry, entry)


def parse_pointer(data: bytes | str | object, uri: str) -> Pointer:
    """The pointer in ``data`` (its bytes or text as stored, or the JSON value already decoded),
    checked field by field; :class:`MalformedPointer` (a ValueError) naming ``uri`` and the field.

    ``version`` must be a version number and ``uri`` text; ``history`` (missing: none) a list of
    moves, each with a ``version`` and an ``action``; ``model``, ``format``, ``promoted_at`` and
    ``run_uri`` are checked when present. The one parse of a pointer, for the registry, the
    report pages and the CLI.
    """
    if isinstance(data, (bytes, bytearray, str)):
        try:
            data = json.loads(data)
        except ValueError as exc:
            raise MalformedPointer(
                f"production pointer {uri} is not valid JSON ({exc}); restore it from a backup, or "
                "delete it to start the model's production anew",
                got=str(exc),
            ) from exc
    if not isinstance(data, dict):
        raise _bad(uri, "(the whole file)", "a JSON object", f"{_kind(data)} {str(data)[:80]}")
    if "format" in data and data["format"] != POINTER_FORMAT:
        raise _bad(uri, "format", f"{POINTER_FORMAT!r}", f"{data['format']!r}")
    if "model" in data and (not isinstance(data["model"], str) or not data["model"]):
        raise _bad(uri, "model", "the model's name", f"{_kind(data['model'])} {data['model']!r}")
    if not _is_version(data.get("version")):
        raise _bad(uri, "version", "a version number >= 1", f"{data.get('version')!r}")
    if not isinstance(data.get("uri"), str) or not data["uri"]:
        raise _bad(uri, "uri", "the version's folder", f"{data.get('uri')!r}")
    for key, types in (("promoted_at", (str,)), ("run_uri", (str, type(None)))):
        if key in data and not isinstance(data[key], types):
            raise _bad(uri, key, "text", f"{_kind(data[key])} {data[key]!r}")
    history = data.get("history", [])
    if not isinstance(history, list):
        raise _bad(uri, "history", "a list of moves", f"{_kind(history)} {str(history)[:80]}")
    checked = [_check_entry(entry, uri, i) for i, entry in enumerate(history)]
    return cast(Pointer, {**data, "history": checked})


def name_conflict(uri: str, *, name: str, recorded: str) -> RegistryNameConflict:
    """The error for ``uri`` (a pointer or claim in the folder computed for model ``name``)
    recording model ``recorded`` instead: both names, and where trainops looks for
    ``recorded``'s registry now."""
    models, found, _ = uri.partition("/models/")
    try:
        home = (
            f"; it now looks for {recorded!r}'s in {models}/models/{safe_segment(recorded)}/" if found else ""
        )
    except ValueError:
        home = ""
    return RegistryNameConflict(
        f"{uri} records model {recorded!r}, not {name!r}: this folder is {recorded!r}'s registry "
        f"(trainops before #25 gave both names this folder{home}), so {name!r} may not use it; nothing "
        f"was changed. Give {name!r} another name, or move {recorded!r}'s registry out of this folder first",
        name=name,
        recorded=recorded,
        uri=uri,
    )


def check_owner(pointer: Pointer | None, uri: str, name: str) -> None:
    """Refuse (:class:`RegistryNameConflict`) a pointer that records another model than ``name``;
    one that records none (written by hand, or None) is accepted."""
    recorded = pointer.get("model") if pointer else None
    if recorded is not None and recorded != name:
        raise name_conflict(uri, name=name, recorded=recorded)


def check_not_left_behind(storage: Storage, uri: str, name: str) -> None:
    """Refuse (:class:`LegacyRegistry`) when model ``name`` has no pointer at ``uri`` but its
    registry is still where trainops before #25 kept it: a name outside ``[A-Za-z0-9._=-]`` had
    the folder of its characters as ``_`` (``fraud model`` in ``fraud_model/``), and now has its
    own (``fraud_model~8ddd64345d7b/``). Going on would start a second registry at v1, and a warm
    start from production would silently train from scratch. A pointer there that records
    another model, or none, is not this model's: nothing to say."""
    segment, legacy = safe_segment(name), legacy_segment(name)
    tail = f"/{segment}/production.json"
    if segment == legacy or not uri.endswith(tail):
        return
    models = uri[: -len(tail)]
    old = f"{models}/{legacy}/production.json"
    try:
        recorded = parse_pointer(storage.get(old), old).get("model")
    except (NotFound, ValueError):
        return
    if recorded == name:
        raise LegacyRegistry(
            f"model {name!r} has no registry in {models}/{segment}/ yet, but its registry from before "
            f"trainops mapped names injectively is in {models}/{legacy}/ (a folder another name, "
            f"{legacy!r}, could claim): nothing was read or changed. Copy that folder's objects to "
            f"{models}/{segment}/ (for example `aws s3 sync {models}/{legacy}/ {models}/{segment}/`, or "
            f"`cp -a` on file://), keep the old folder (its versions' URIs stay in the history), then run "
            "again",
            name=name,
            recorded=recorded,
            uri=old,
        )


def read_pointer(
    storage: Storage, uri: str, *, model: str | None = None
) -> tuple[Pointer | None, str | None]:
    """The pointer at ``uri`` and its etag, or (None, None) when there is none.

    :param model: the model whose pointer this is: a pointer recording another model is refused
        (:func:`check_owner`). None: whichever model's (a reader that only shows it).
    """
    try:
        data, etag = storage.get_with_etag(uri)
    except NotFound:
        if model is not None:
            check_not_left_behind(storage, uri, model)
        return None, None
    pointer = parse_pointer(data, uri)
    if model is not None:
        check_owner(pointer, uri, model)
    return pointer, etag


def read_production(storage: Storage, root: str, name: str) -> Pointer | None:
    """The production pointer of model ``name``, or None if it has never been promoted; a
    pointer of another model is refused (:class:`RegistryNameConflict`), and so is a name that
    is not one (ValueError, :func:`trainer.contract.check_name`)."""
    check_name(name, "model name")
    return read_pointer(storage, production_pointer(root, name), model=name)[0]


def new_pointer(
    previous: Pointer | None, *, name: str, version: int, version_uri: str, entry: Move
) -> Pointer:
    """The pointer after a move to ``version``; ``entry`` joins the history, and the rest of
    the previous history is kept as it was."""
    history = list(previous.get("history", [])) if previous else []
    moved: HistoryEntry = {"version": version, **entry}
    history.append(moved)
    return {
        "format": POINTER_FORMAT,
        "model": name,
        "version": version,
        "uri": version_uri,
        "promoted_at": entry["at"],
        "run_uri": entry.get("run_uri"),
        "history": history,
    }


def move_pointer(
    storage: Storage, uri: str, decide: Decide, *, model: str, action: str, recorded: Recorded
) -> Moved:
    """Move the pointer at ``uri`` by compare-and-swap; what the move did.

    :param model: the model whose pointer this is: every try refuses a pointer that records
        another model (:class:`RegistryNameConflict`), before it looks for the move or decides.

    :param decide: called with the pointer as read, on every try; returns the new pointer,
        whose last history entry is the move, or raises to stop (nothing is written).
    :param action: what gives up after :data:`MAX_CAS_TRIES` lost writes (``"promotion"``,
        ``"rollback"``); the PromotionError then says to retry it.
    :param recorded: recognises the move in a history; checked on every try before ``decide``,
        so a move that an earlier try (or task) wrote is returned as done, ``found`` True.
    """
    for _ in range(MAX_CAS_TRIES):
        pointer, etag = read_pointer(storage, uri, model=model)
        done = find_move(pointer, recorded)
        if done is not None:
            log.info(
                "production pointer %s already records this %s (v%d, at %s): an earlier try took "
                "effect; not writing it again",
                uri,
                action,
                done["entry"]["version"],
                done["entry"].get("at"),
            )
            return done
        new = decide(pointer)
        try:
            _write(storage, uri, new, etag)
        except PreconditionFailed:
            # Someone wrote the pointer since we read it (or our write took effect and a rival
            # wrote over it before the client could see its token): read again, look for the
            # move, decide again.
            continue
        previous = pointer["version"] if pointer else None
        return {"entry": new["history"][-1], "previous_version": previous, "pointer": new, "found": False}
    raise PromotionError(
        f"production pointer {uri!r} kept changing over {MAX_CAS_TRIES} compare-and-swap tries; "
        f"retry the {action}"
    )


def _write(storage: Storage, uri: str, pointer: Pointer, etag: str | None) -> None:
    """The pointer's only write: conditional on the etag read, or on there being none."""
    if etag is not None:
        storage.put_json(uri, pointer, if_match=etag)
    else:
        storage.put_json(uri, pointer, if_none_match=True)
