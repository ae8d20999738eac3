"""Which failed record an attempt keeps when several ranks fail: the root cause, rank 0's figures.

When one rank fails (its program raised, its GPU is gone, its storage refused), the others
usually fail next, in a collective with the peer that died: a network error, which is a
consequence, not the cause. Whether anything can help depends on the cause: a restart in place
or a relaunch may cure a network or a node failure, never a program error. So the record must
not let a consequence hide its cause, whichever rank writes last.

Each failing rank reads the attempt's record and writes with a condition on what it read
(compare-and-swap), deciding with :func:`to_store`. A record is an incarnation's: its
``restarts`` list the incarnations before it (torchrun's restarts in place), so one of an
earlier incarnation is history, already carried in the new one's ``restarts``, and is
replaced. Within one incarnation rank 0's record wins, since it alone holds the metrics
figures, but it takes another rank's cause, error and hint where its own failure is a network
error and theirs is not. A record of a later incarnation (this rank is a straggler of an older
one) is left alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from trainer.checkpoint.fence import read_object
from trainer.contract import AttemptRecord, RunLayout, earlier_incarnations
from trainer.storage import PreconditionFailed, Storage

# Conditional writes that may lose a race with another failing rank before rank 0 writes anyway.
TRIES = 3
_ROOT = ("cause", "error", "hint")


def incarnation(record: object) -> int:
    """Which incarnation of its attempt wrote ``record``: 0 the first, 1 after one restart in
    place, and so on (the number of incarnations its ``restarts`` lists)."""
    return len(earlier_incarnations(record))


def _with_root_cause(record: AttemptRecord, other: Mapping[str, Any]) -> AttemptRecord:
    return cast(AttemptRecord, {**record, **{key: other.get(key) for key in _ROOT}})


def _names_a_cause(record: Mapping[str, Any]) -> bool:
    return record.get("outcome") == "failed" and record.get("cause") not in (None, "network")


def to_store(mine: AttemptRecord, there: object, *, is_main: bool) -> AttemptRecord | None:
    """The failed record a rank stores over ``there`` (the attempt's record as read; None when
    there is none, or not a record), or None to leave ``there`` as it is (module docstring)."""
    if not isinstance(there, Mapping) or incarnation(there) < incarnation(mine):
        return mine
    if incarnation(there) > incarnation(mine):
        return None  # a straggler of an older incarnation: the newer one's record stands
    network = mine.get("cause") == "network"
    if is_main:
        return _with_root_cause(mine, there) if network and _names_a_cause(there) else mine
    if there.get("outcome") == "failed" and there.get("cause") == "network" and _names_a_cause(mine):
        return _with_root_cause(cast(AttemptRecord, dict(there)), mine)
    return None


def store_failure(
    storage: Storage, layout: RunLayout, record: AttemptRecord, *, is_main: bool
) -> AttemptRecord:
    """Store this rank's failed ``record`` as :func:`to_store` decides, each write conditional
    on the record it read; the record the attempt keeps as far as this rank knows. After
    :data:`TRIES` lost races rank 0 writes its own unconditionally, and another rank gives up.
    A storage error propagates (the caller prints the record instead)."""
    uri = layout.attempt(record["attempt"])
    for _ in range(TRIES):
        there, etag = read_object(storage, uri)  # a body that is not JSON reads as none
        chosen = to_store(record, there, is_main=is_main)
        if chosen is None:
            return cast(AttemptRecord, there)
        try:
            if etag is None:
                storage.put_json(uri, chosen, if_none_match=True)
            else:
                storage.put_json(uri, chosen, if_match=etag)
            return chosen
        except PreconditionFailed:
            continue  # another rank wrote between the read and the write: decide again
    if is_main:
        storage.put_json(uri, record)
    return record
