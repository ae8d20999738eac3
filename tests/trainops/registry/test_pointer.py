"""The production pointer and its one compare-and-swap, on file:// and s3:// (moto over HTTP)."""

from __future__ import annotations

import json

import pytest

from tests.trainops.registry.helpers import BeforePointerWrite, LostAfterWrite
from trainer.contract import production_pointer, safe_segment
from trainer.storage import open_storage
from trainops.registry.errors import MalformedPointer, RegistryNameConflict
from trainops.registry.pointer import (
    MAX_CAS_TRIES,
    POINTER_FORMAT,
    HistoryEntry,
    Pointer,
    find_move,
    move_pointer,
    names_version,
    new_pointer,
    parse_pointer,
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


def is_move(version: int, run: str):
    """Recognises the entry ``promote_move(root, version, run)`` writes."""
    return lambda entry: (entry["version"], entry["action"], entry["run_uri"]) == (version, "promote", run)


def move(storage, uri: str, root: str, version: int, run: str, **kwargs):
    return move_pointer(
        storage,
        uri,
        promote_move(root, version, run),
        model=MODEL,
        action="promotion",
        recorded=is_move(version, run),
        **kwargs,
    )


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
    move(storage, uri, root, 1, "run-1")
    pointer, etag = read_pointer(storage, uri)
    assert pointer == read_production(storage, root, MODEL) and pointer["version"] == 1
    assert etag == storage.head(uri)["etag"]


def test_malformed_pointer_is_reported(file_root):
    storage = open_storage(file_root)
    uri = production_pointer(file_root, MODEL)
    storage.put(uri, b'{"version": "two"}')
    with pytest.raises(PromotionError) as err:
        read_production(storage, file_root, MODEL)
    assert str(err.value) == (
        f"production pointer {uri}: field 'version' must be a version number >= 1, got 'two'; "
        "restore the file from a backup, or delete it to start the model's production anew"
    )


def test_a_pointer_that_is_not_json_is_reported(file_root):
    storage = open_storage(file_root)
    storage.put(production_pointer(file_root, MODEL), b"{not json")
    with pytest.raises(
        PromotionError, match=r"production\.json is not valid JSON .*restore it from a backup"
    ):
        read_production(storage, file_root, MODEL)


# ---------------------------------------------------------------------- compare-and-swap


def test_the_first_move_creates_the_pointer_and_later_ones_replace_it(root):
    storage = open_storage(root)
    uri = production_pointer(root, MODEL)
    first = move(storage, uri, root, 1, "run-1")
    assert first["previous_version"] is None and first["pointer"] == read_production(storage, root, MODEL)
    assert first["found"] is False and first["entry"] == first["pointer"]["history"][-1]
    second = move(storage, uri, root, 2, "run-2")
    assert second["previous_version"] == 1 and second["pointer"]["version"] == 2
    assert [h["version"] for h in read_production(storage, root, MODEL)["history"]] == [1, 2]


def test_a_rival_creating_the_pointer_first_is_seen_and_kept(root):
    storage = open_storage(root)
    uri = production_pointer(root, MODEL)
    seen = []

    def decide(pointer):
        seen.append(pointer and pointer["version"])
        return promote_move(root, 2, "mine")(pointer)

    rival = BeforePointerWrite(storage, uri, lambda: move(storage, uri, root, 1, "rival"))
    moved = move_pointer(rival, uri, decide, model=MODEL, action="promotion", recorded=is_move(2, "mine"))
    # The If-None-Match write lost to the rival's; the second try decided on the rival's pointer.
    assert seen == [None, 1] and moved["previous_version"] == 1 and moved["found"] is False
    assert [h["run_uri"] for h in read_production(storage, root, MODEL)["history"]] == ["rival", "mine"]


def test_decide_stops_a_move_by_raising_and_nothing_is_written(file_root):
    storage = open_storage(file_root)
    uri = production_pointer(file_root, MODEL)
    move(storage, uri, file_root, 1, "run-1")
    before = storage.get(uri)

    def refuse(pointer):
        raise PromotionError(f"not moving from v{pointer['version']}")

    with pytest.raises(PromotionError, match="not moving from v1"):
        move_pointer(storage, uri, refuse, model=MODEL, action="rollback", recorded=lambda entry: False)
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
    move(storage, uri, file_root, 1, "run-1")
    busy = RewritesBeforeEveryWrite(storage, uri)
    with pytest.raises(PromotionError) as err:
        move_pointer(
            busy,
            uri,
            promote_move(file_root, 2, "run-2"),
            model=MODEL,
            action="rollback",
            recorded=is_move(2, "run-2"),
        )
    assert str(err.value) == (
        f"production pointer {uri!r} kept changing over {MAX_CAS_TRIES} compare-and-swap tries; "
        "retry the rollback"
    )
    assert busy.rewrites == MAX_CAS_TRIES
    assert read_production(storage, file_root, MODEL)["version"] == 1


# ------------------------------------------------------------- a move that knows what it did


def test_finding_a_move_in_the_history_gives_the_version_it_replaced():
    pointer = promote_move("file:///r", 1, "a")(None)
    pointer = promote_move("file:///r", 2, "b")(pointer)
    pointer = promote_move("file:///r", 3, "c")(pointer)
    found = find_move(pointer, is_move(2, "b"))
    assert found == {"entry": pointer["history"][1], "previous_version": 1, "pointer": pointer, "found": True}
    assert find_move(pointer, is_move(1, "a"))["previous_version"] is None
    assert find_move(pointer, is_move(4, "d")) is None
    assert find_move(None, is_move(1, "a")) is None


def test_a_pointer_names_its_version_and_every_version_of_its_history():
    pointer = promote_move("file:///r", 1, "a")(None)
    pointer = promote_move("file:///r", 3, "c")(pointer)
    assert [v for v in range(5) if names_version(pointer, v)] == [1, 3]
    assert not names_version(None, 1)


def test_a_write_that_took_effect_but_was_reported_lost_is_found_not_repeated(root):
    """The case the write token cannot tell: the write took effect, its reply was lost, and a
    rival moved the pointer on before the client read it back, so ``put`` raised
    PreconditionFailed. The next try finds the move in the history and decides nothing."""
    storage = open_storage(root)
    uri = production_pointer(root, MODEL)
    move(storage, uri, root, 1, "run-1")
    decided = []

    def decide(pointer):
        decided.append(pointer["version"])
        return promote_move(root, 2, "mine")(pointer)

    lossy = LostAfterWrite(storage, uri, lambda: move(storage, uri, root, 3, "rival"))
    moved = move_pointer(lossy, uri, decide, model=MODEL, action="promotion", recorded=is_move(2, "mine"))
    assert decided == [1]  # decided once, on v1; never again on the pointer its own write made
    assert moved["found"] is True and moved["previous_version"] == 1
    assert moved["entry"]["version"] == 2 and moved["pointer"]["version"] == 3
    history = read_production(storage, root, MODEL)["history"]
    assert [(h["version"], h["run_uri"]) for h in history] == [(1, "run-1"), (2, "mine"), (3, "rival")]


def test_a_move_already_in_the_history_is_not_written_again(file_root):
    storage = open_storage(file_root)
    uri = production_pointer(file_root, MODEL)
    move(storage, uri, file_root, 1, "run-1")
    move(storage, uri, file_root, 2, "run-2")
    before = storage.get(uri)
    again = move(storage, uri, file_root, 1, "run-1")
    assert again["found"] is True and again["previous_version"] is None and again["pointer"]["version"] == 2
    assert storage.get(uri) == before


# ------------------------------------------------------------------ shape and owner


def a_pointer(**fields) -> dict:
    """A well-formed pointer of MODEL at v2, with ``fields`` laid over it."""
    return {
        "format": POINTER_FORMAT,
        "model": MODEL,
        "version": 2,
        "uri": "file:///r/models/demo-lm/versions/2",
        "promoted_at": "2026-01-02T00:00:00+00:00",
        "run_uri": "file:///r/runs/b",
        "history": [
            {
                "version": 1,
                "at": "2026-01-01T00:00:00+00:00",
                "action": "promote",
                "run_uri": "file:///r/runs/a",
            },
            {
                "version": 2,
                "at": "2026-01-02T00:00:00+00:00",
                "action": "promote",
                "run_uri": "file:///r/runs/b",
            },
        ],
        **fields,
    }


@pytest.mark.parametrize("as_stored", [json.dumps, lambda p: json.dumps(p).encode(), lambda p: p])
def test_a_pointer_parses_from_its_bytes_its_text_or_its_json_value(as_stored):
    assert parse_pointer(as_stored(a_pointer()), "file:///r/models/demo-lm/production.json") == a_pointer()


@pytest.mark.parametrize(
    ("fields", "field", "problem"),
    [
        ({"history": {"1": {"version": 1}}}, "history", "must be a list of moves, got dict"),
        ({"history": "v1, v2"}, "history", "must be a list of moves, got str v1, v2"),
        ({"history": [7]}, "history[0]", "must be an object (one move), got int 7"),
        (
            {"history": [{"action": "promote"}]},
            "history[0].version",
            "must be a version number >= 1, got None",
        ),
        ({"history": [{"version": 1, "action": "promote"}, {"version": 2}]}, "history[1].action", "got None"),
        (
            {"history": [{"version": 2, "action": "rollback", "from_version": "v1"}]},
            "history[0].from_version",
            "got 'v1'",
        ),
        (
            {"history": [{"version": 1, "action": "promote", "by": 3}]},
            "history[0].by",
            "must be text, got int 3",
        ),
        ({"version": True}, "version", "must be a version number >= 1, got True"),
        ({"version": 0}, "version", "got 0"),
        ({"uri": None}, "uri", "must be the version's folder, got None"),
        ({"model": 7}, "model", "must be the model's name, got int 7"),
        ({"format": "trainops.production/v9"}, "format", "must be 'trainops.production/v1'"),
        ({"run_uri": 5}, "run_uri", "must be text, got int 5"),
    ],
)
def test_a_malformed_pointer_is_refused_naming_the_file_and_the_field(fields, field, problem):
    uri = "s3://b/models/demo-lm/production.json"
    with pytest.raises(ValueError) as refused:  # a ValueError for every reader, a PromotionError too
        parse_pointer(a_pointer(**fields), uri)
    assert isinstance(refused.value, MalformedPointer) and isinstance(refused.value, PromotionError)
    assert str(refused.value).startswith(f"production pointer {uri}: field {field!r} ")
    assert problem in str(refused.value)
    assert str(refused.value).endswith(
        "restore the file from a backup, or delete it to start the model's production anew"
    )


@pytest.mark.parametrize("data", [b"[1, 2]", b'"v2"', b"null"])
def test_a_pointer_that_is_not_an_object_is_refused(data):
    with pytest.raises(
        MalformedPointer, match=r"production pointer f: field '\(the whole file\)' must be a JSON object"
    ):
        parse_pointer(data, "f")


def test_a_pointer_of_another_model_is_refused_naming_both_and_nothing_is_written(file_root):
    """The folder computed for one name holds another model's pointer (trainops before #25 gave
    ``fraud model`` the folder ``fraud_model``): reading or moving it as the other name's is
    refused, saying whose it is and where that registry belongs now."""
    storage = open_storage(file_root)
    uri = production_pointer(file_root, "fraud_model")
    storage.put_json(uri, a_pointer(model="fraud model", uri=f"{file_root}/models/fraud_model/versions/2"))
    before = storage.get(uri)

    with pytest.raises(RegistryNameConflict) as refused:
        read_production(storage, file_root, "fraud_model")
    assert str(refused.value) == (
        f"{uri} records model 'fraud model', not 'fraud_model': this folder is 'fraud model''s "
        "registry (trainops before #25 gave both names this folder; it now looks for 'fraud model''s in "
        f"{file_root}/models/{safe_segment('fraud model')}/), so 'fraud_model' may not use it; nothing "
        "was changed. Give 'fraud_model' another name, or move 'fraud model''s registry out of this folder "
        "first"
    )
    with pytest.raises(RegistryNameConflict, match="records model 'fraud model', not 'fraud_model'"):
        move_pointer(
            storage,
            uri,
            promote_move(file_root, 3, "run-3"),
            model="fraud_model",
            action="promotion",
            recorded=is_move(3, "run-3"),
        )
    assert storage.get(uri) == before
    # Read as its own model's, or by a reader that only shows it, it is a pointer.
    assert read_pointer(storage, uri, model="fraud model")[0]["version"] == 2
    assert read_pointer(storage, uri)[0]["model"] == "fraud model"


def test_a_pointer_with_no_name_is_accepted_and_the_next_move_writes_the_name(file_root):
    storage = open_storage(file_root)
    uri = production_pointer(file_root, MODEL)
    legacy = a_pointer()
    del legacy["model"]
    storage.put_json(uri, legacy)
    assert read_production(storage, file_root, MODEL)["version"] == 2
    move(storage, uri, file_root, 3, "run-3")
    assert storage.get_json(uri)["model"] == MODEL
