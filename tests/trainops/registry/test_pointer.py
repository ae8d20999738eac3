"""The production pointer and its one compare-and-swap, on file:// and s3:// (moto over HTTP)."""

from __future__ import annotations

import pytest

from tests.trainops.registry.helpers import BeforePointerWrite
from trainer.contract import production_pointer
from trainer.storage import open_storage
from trainops.registry.pointer import (
    MAX_CAS_TRIES,
    POINTER_FORMAT,
    HistoryEntry,
    Pointer,
    move_pointer,
    new_pointer,
    read_pointer,
    read_production,
)
from trainops.registry.promotion import PromotionError

MODEL = "demo-lm"


def version_uri(root: str, version: int) -> str:
    return f"{root}/models/{MODEL}/versions/{version}"


def promote_move(root: str, version: int, run: str):
    """A ``decide`` that moves production to ``version`` from whatever it is."""

    def decide(pointer):
        return new_pointer(
            pointer,
            name=MODEL,
            version=version,
            version_uri=version_uri(root, version),
            entry={"at": f"2026-01-0{version}T00:00:00+00:00", "action": "promote", "run_uri": run},
        )

    return decide


# ------------------------------------------------------------------------------ pure


def test_a_new_pointer_names_the_version_and_appends_the_move_to_the_history():
    first = new_pointer(
        None,
        name=MODEL,
        version=1,
        version_uri="file:///r/models/demo-lm/versions/1",
        entry={"at": "2026-01-01T00:00:00+00:00", "action": "promote", "run_uri": "file:///r/runs/a"},
    )
    assert first == {
        "format": POINTER_FORMAT,
        "model": MODEL,
        "version": 1,
        "uri": "file:///r/models/demo-lm/versions/1",
        "promoted_at": "2026-01-01T00:00:00+00:00",
        "run_uri": "file:///r/runs/a",
        "history": [
            {
                "version": 1,
                "at": "2026-01-01T00:00:00+00:00",
                "action": "promote",
                "run_uri": "file:///r/runs/a",
            }
        ],
    }
    back = new_pointer(
        {**first, "note": "not carried over"},
        name=MODEL,
        version=1,
        version_uri="file:///r/models/demo-lm/versions/1",
        entry={
            "at": "2026-01-02T00:00:00+00:00",
            "action": "rollback",
            "from_version": 2,
            "by": "alice",
            "reason": "r",
            "run_uri": "file:///r/runs/a",
        },
    )
    assert "note" not in back and back["promoted_at"] == "2026-01-02T00:00:00+00:00"
    assert back["history"][0] == first["history"][0]
    assert back["history"][1] == {
        "version": 1,
        "at": "2026-01-02T00:00:00+00:00",
        "action": "rollback",
        "from_version": 2,
        "by": "alice",
        "reason": "r",
        "run_uri": "file:///r/runs/a",
    }
    assert first["history"] == [first["history"][0]]  # the previous pointer is left as it was
    # The declared records are what is written (TypedDicts are not checked at run time).
    assert set(back) == set(Pointer.__annotations__)
    for entry in back["history"]:
        assert HistoryEntry.__required_keys__ <= set(entry) <= set(HistoryEntry.__annotations__)


# ------------------------------------------------------------------------- reading


def test_no_pointer_reads_as_none(root):
    storage = open_storage(root)
    assert read_pointer(storage, production_pointer(root, MODEL)) == (None, None)
    assert read_production(storage, root, MODEL) is None


def test_reading_returns_the_pointer_and_the_etag_its_write_checks(root):
    storage = open_storage(root)
    uri = production_pointer(root, MODEL)
    move_pointer(storage, uri, promote_move(root, 1, "run-1"), action="promotion")
    pointer, etag = read_pointer(storage, uri)
    assert pointer == read_production(storage, root, MODEL) and pointer["version"] == 1
    assert etag == storage.head(uri)["etag"]


def test_malformed_pointer_is_reported(file_root):
    storage = open_storage(file_root)
    storage.put(production_pointer(file_root, MODEL), b'{"version": "two"}')
    with pytest.raises(PromotionError, match=r"production\.json.*malformed.*'two'"):
        read_production(storage, file_root, MODEL)


def test_a_pointer_that_is_not_json_is_reported(file_root):
    storage = open_storage(file_root)
    storage.put(production_pointer(file_root, MODEL), b"{not json")
    with pytest.raises(
        PromotionError, match=r"production\.json' is not valid JSON .*restore it or delete it"
    ):
        read_production(storage, file_root, MODEL)


# ---------------------------------------------------------------------- compare-and-swap


def test_the_first_move_creates_the_pointer_and_later_ones_replace_it(root):
    storage = open_storage(root)
    uri = production_pointer(root, MODEL)
    replaced, written = move_pointer(storage, uri, promote_move(root, 1, "run-1"), action="promotion")
    assert replaced is None and written == read_production(storage, root, MODEL)
    replaced, written = move_pointer(storage, uri, promote_move(root, 2, "run-2"), action="promotion")
    assert replaced["version"] == 1 and written["version"] == 2
    assert [h["version"] for h in read_production(storage, root, MODEL)["history"]] == [1, 2]


def test_a_rival_creating_the_pointer_first_is_seen_and_kept(root):
    storage = open_storage(root)
    uri = production_pointer(root, MODEL)
    seen = []

    def decide(pointer):
        seen.append(pointer and pointer["version"])
        return promote_move(root, 2, "mine")(pointer)

    rival = BeforePointerWrite(
        storage, uri, lambda: move_pointer(storage, uri, promote_move(root, 1, "rival"), action="promotion")
    )
    replaced, _ = move_pointer(rival, uri, decide, action="promotion")
    # The If-None-Match write lost to the rival's; the second try decided on the rival's pointer.
    assert seen == [None, 1] and replaced["run_uri"] == "rival"
    assert [h["run_uri"] for h in read_production(storage, root, MODEL)["history"]] == ["rival", "mine"]


def test_decide_stops_a_move_by_raising_and_nothing_is_written(file_root):
    storage = open_storage(file_root)
    uri = production_pointer(file_root, MODEL)
    move_pointer(storage, uri, promote_move(file_root, 1, "run-1"), action="promotion")
    before = storage.get(uri)

    def refuse(pointer):
        raise PromotionError(f"not moving from v{pointer['version']}")

    with pytest.raises(PromotionError, match="not moving from v1"):
        move_pointer(storage, uri, refuse, action="rollback")
    assert storage.get(uri) == before


class RewritesBeforeEveryWrite:
    """Real storage on which a rival rewrites the pointer before each of our writes."""

    def __init__(self, storage, uri):
        self._storage, self._uri, self.rewrites = storage, uri, 0

    def put_json(self, uri, obj, **conditions):
        if uri == self._uri:
            self.rewrites += 1
            current = self._storage.get_json(uri)
            self._storage.put_json(uri, {**current, "note": f"rewrite {self.rewrites}"})
        return self._storage.put_json(uri, obj, **conditions)

    def __getattr__(self, name):
        return getattr(self._storage, name)


def test_a_pointer_that_keeps_changing_gives_up_after_the_bounded_tries(file_root):
    storage = open_storage(file_root)
    uri = production_pointer(file_root, MODEL)
    move_pointer(storage, uri, promote_move(file_root, 1, "run-1"), action="promotion")
    busy = RewritesBeforeEveryWrite(storage, uri)
    with pytest.raises(PromotionError) as err:
        move_pointer(busy, uri, promote_move(file_root, 2, "run-2"), action="rollback")
    assert str(err.value) == (
        f"production pointer {uri!r} kept changing over {MAX_CAS_TRIES} compare-and-swap tries; "
        "retry the rollback"
    )
    assert busy.rewrites == MAX_CAS_TRIES
    assert read_production(storage, file_root, MODEL)["version"] == 1
