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
"""

# No postponed annotations here: TypedDict tells required from NotRequired keys at run time
# only from evaluated annotations (``__required_keys__``).
import json
import logging
from collections.abc import Callable
from typing import NotRequired, TypedDict, cast

from trainer.contract import production_pointer
from trainer.storage import NotFound, PreconditionFailed, Storage
from trainops.registry.errors import PromotionError

__all__ = [
    "MAX_CAS_TRIES",
    "POINTER_FORMAT",
    "Decide",
    "HistoryEntry",
    "Move",
    "Moved",
    "Pointer",
    "Recorded",
    "find_move",
    "move_pointer",
    "names_version",
    "new_pointer",
    "read_pointer",
    "read_production",
]

POINTER_FORMAT = "trainops.production/v1"
MAX_CAS_TRIES = 20

log = logging.getLogger(__name__)


class Move(TypedDict):
    """What a move records in the history, besides the version it moves to."""

    at: str
    action: str  # "promote" or "rollback"
    run_uri: str | None  # the run the version came from
    from_version: NotRequired[int]  # a rollback's: the version it replaced
    by: NotRequired[str]
    reason: NotRequired[str]
    via: NotRequired[str]  # a rollback's task, as dag_id/run_id/task_id


class HistoryEntry(Move):
    version: int


class Pointer(TypedDict):
    """``production.json``: the version in production and every move that led there."""

    format: str
    model: str
    version: int
    uri: str  # the version's prefix, models/<name>/versions/<v>
    promoted_at: str  # when it became production (the last move's ``at``)
    run_uri: str | None
    history: list[HistoryEntry]


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


def _parse(data: object, uri: str) -> Pointer:
    if (
        not isinstance(data, dict)
        or not isinstance(data.get("version"), int)
        or isinstance(data.get("version"), bool)
    ):
        raise PromotionError(
            f"production pointer {uri!r} is malformed (no integer 'version': {str(data)[:200]}); "
            "restore it from its history or delete it"
        )
    # Only the version is relied on unchecked; the other fields are read with .get().
    return cast(Pointer, data)


def read_pointer(storage: Storage, uri: str) -> tuple[Pointer | None, str | None]:
    """The pointer at ``uri`` and its etag, or (None, None) when there is none."""
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
    return _parse(obj, uri), etag


def read_production(storage: Storage, root: str, name: str) -> Pointer | None:
    """The production pointer of model ``name``, or None if it has never been promoted."""
    return read_pointer(storage, production_pointer(root, name))[0]


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


def move_pointer(storage: Storage, uri: str, decide: Decide, *, action: str, recorded: Recorded) -> Moved:
    """Move the pointer at ``uri`` by compare-and-swap; what the move did.

    :param decide: called with the pointer as read, on every try; returns the new pointer,
        whose last history entry is the move, or raises to stop (nothing is written).
    :param action: what gives up after :data:`MAX_CAS_TRIES` lost writes (``"promotion"``,
        ``"rollback"``); the PromotionError then says to retry it.
    :param recorded: recognises the move in a history; checked on every try before ``decide``,
        so a move that an earlier try (or task) wrote is returned as done, ``found`` True.
    """
    for _ in range(MAX_CAS_TRIES):
        pointer, etag = read_pointer(storage, uri)
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
