"""Rollback through the pointer's compare-and-swap."""

from __future__ import annotations

import json

import pytest

from tests.trainops.registry.helpers import BeforePointerWrite, KeyFaults, OutageAfterWrite, promote_runs
from trainer.contract import join, model_version_prefix, production_pointer
from trainer.storage import StorageUnavailable, open_storage
from trainops.registry.promotion import PromotionError, read_production
from trainops.registry.rollback import RollbackConflict, rollback


def test_rollback_moves_the_pointer_and_records_who_and_why(root):
    storage = open_storage(root)
    runs = promote_runs(storage, root, 3)
    result = rollback(storage, root, "demo-lm", 2, reason="v3 answers in German", by="alice")
    assert result["changed"] is True
    assert (result["version"], result["previous_version"], result["by"]) == (2, 3, "alice")
    pointer = read_production(storage, root, "demo-lm")
    assert pointer["version"] == 2
    assert pointer["uri"] == model_version_prefix(root, "demo-lm", 2)
    assert pointer["run_uri"] == runs[1]
    last = pointer["history"][-1]
    assert last == {
        "version": 2,
        "at": result["at"],
        "action": "rollback",
        "from_version": 3,
        "by": "alice",
        "reason": "v3 answers in German",
        "run_uri": runs[1],
    }
    assert [(h["version"], h["action"]) for h in pointer["history"]] == [
        (1, "promote"),
        (2, "promote"),
        (3, "promote"),
        (2, "rollback"),
    ]
    # Forward again to v3 is a rollback too: it was production before.
    rollback(storage, root, "demo-lm", 3, reason="fixed the prompt", by="bob")
    assert read_production(storage, root, "demo-lm")["version"] == 3


def test_rollback_to_the_current_version_changes_nothing(file_root):
    storage = open_storage(file_root)
    promote_runs(storage, file_root, 2)
    before = storage.get(production_pointer(file_root, "demo-lm"))
    result = rollback(storage, file_root, "demo-lm", 2, reason="again", by="alice")
    assert result["changed"] is False
    assert storage.get(production_pointer(file_root, "demo-lm")) == before


@pytest.mark.parametrize(
    "version, reason, by, words",
    [
        (7, "r", "a", ["no version 7", "v1, v2, v3"]),
        (0, "r", "a", ["positive integer", "0"]),
        (1, "  ", "a", ["needs a reason"]),
        (1, "r", "", ["who"]),
    ],
)
def test_bad_rollbacks_are_refused_with_the_reason(file_root, version, reason, by, words):
    storage = open_storage(file_root)
    promote_runs(storage, file_root, 3)
    with pytest.raises(PromotionError) as err:
        rollback(storage, file_root, "demo-lm", version, reason=reason, by=by)
    for word in words:
        assert word in str(err.value)
    assert read_production(storage, file_root, "demo-lm")["version"] == 3


def test_a_version_that_was_never_production_is_refused(file_root):
    storage = open_storage(file_root)
    promote_runs(storage, file_root, 2)
    # v3 exists (a promotion that lost its race keeps its claim) but never went live.
    storage.put_json(join(model_version_prefix(file_root, "demo-lm", 3), "_claim.json"), {})
    with pytest.raises(
        PromotionError,
        match=r"v3 of 'demo-lm' was never production "
        r"\(history: v1, v2\)",
    ):
        rollback(storage, file_root, "demo-lm", 3, reason="r", by="a")


def test_an_incomplete_target_is_refused(file_root):
    storage = open_storage(file_root)
    promote_runs(storage, file_root, 2)
    storage.delete(join(model_version_prefix(file_root, "demo-lm", 1), "model.safetensors"))
    with pytest.raises(PromotionError, match=r"v1 of 'demo-lm' is missing 'model.safetensors'"):
        rollback(storage, file_root, "demo-lm", 1, reason="r", by="a")
    assert read_production(storage, file_root, "demo-lm")["version"] == 2


def test_a_target_whose_card_is_not_an_object_is_refused(file_root):
    storage = open_storage(file_root)
    promote_runs(storage, file_root, 2)
    storage.put_json(join(model_version_prefix(file_root, "demo-lm", 1), "card.json"), ["not", "a", "card"])
    with pytest.raises(
        PromotionError, match=r"v1 of 'demo-lm': file://.*/card.json should hold a JSON object .*got a list"
    ):
        rollback(storage, file_root, "demo-lm", 1, reason="r", by="a")
    assert read_production(storage, file_root, "demo-lm")["version"] == 2


def test_a_target_whose_card_is_cut_short_or_damaged_is_refused_naming_the_field(file_root):
    storage = open_storage(file_root)
    promote_runs(storage, file_root, 2)
    uri = join(model_version_prefix(file_root, "demo-lm", 1), "card.json")
    card = storage.get_json(uri)
    storage.put(uri, json.dumps(card).encode()[:30])
    with pytest.raises(PromotionError, match=r"v1 of 'demo-lm': file://.*/card.json is not valid JSON \("):
        rollback(storage, file_root, "demo-lm", 1, reason="r", by="a")
    # the run the version came from goes into the pointer's history: it must be a URI
    storage.put_json(uri, {**card, "run_uri": {"not": "a uri"}})
    with pytest.raises(
        PromotionError, match=r"card.json: field 'run_uri' should be a string or null, got an"
    ):
        rollback(storage, file_root, "demo-lm", 1, reason="r", by="a")
    assert read_production(storage, file_root, "demo-lm")["version"] == 2


def test_no_pointer_is_reported(file_root):
    with pytest.raises(PromotionError, match=r"'demo-lm' has no production pointer"):
        rollback(open_storage(file_root), file_root, "demo-lm", 1, reason="r", by="a")


def test_production_moving_during_a_rollback_changes_nothing_and_says_so(root):
    storage = open_storage(root)
    promote_runs(storage, root, 3)
    uri = production_pointer(root, "demo-lm")
    racy = BeforePointerWrite(
        storage, uri, lambda: rollback(storage, root, "demo-lm", 1, reason="other", by="bob")
    )
    with pytest.raises(
        RollbackConflict,
        match=r"moved from v3 to v1 while rolling back to v2; "
        r"nothing was changed",
    ):
        rollback(racy, root, "demo-lm", 2, reason="mine", by="alice")
    pointer = read_production(storage, root, "demo-lm")
    assert pointer["version"] == 1 and pointer["history"][-1]["by"] == "bob"
    assert len(pointer["history"]) == 4


def test_a_rewrite_that_does_not_move_production_is_retried(file_root):
    storage = open_storage(file_root)
    promote_runs(storage, file_root, 2)
    uri = production_pointer(file_root, "demo-lm")
    racy = BeforePointerWrite(
        storage, uri, lambda: storage.put_json(uri, {**storage.get_json(uri), "note": "annotated"})
    )
    assert rollback(racy, file_root, "demo-lm", 1, reason="r", by="a")["changed"] is True
    assert read_production(storage, file_root, "demo-lm")["version"] == 1


# ------------------------------------------------------------------- what a rollback reports


def test_a_rollback_whose_reply_was_lost_reports_the_change_it_made(faulty_s3_root, s3_faults, monkeypatch):
    root = faulty_s3_root
    storage = open_storage(root)
    promote_runs(storage, root, 3)
    faults = KeyFaults(s3_faults, monkeypatch, "models/demo-lm/production.json", actions={1: "reset_after"})

    result = rollback(storage, root, "demo-lm", 2, reason="v3 answers in German", by="alice")

    assert faults.puts == 2
    assert (result["changed"], result["previous_version"], result["production_version"]) == (True, 3, 2)
    history = read_production(storage, root, "demo-lm")["history"]
    assert [(h["version"], h["action"]) for h in history] == [
        (1, "promote"),
        (2, "promote"),
        (3, "promote"),
        (2, "rollback"),
    ]
    assert history[-1]["at"] == result["at"]


def test_a_rollback_reported_lost_after_a_rival_moved_on_says_it_moved_production(
    faulty_s3_root, s3_faults, moto_server, monkeypatch
):
    """The write took effect and its reply was lost; before the client's retry another rollback
    moved production on, so the client reports PreconditionFailed. The rollback used to call
    that a conflict and say that nothing was changed, although it had moved production."""
    root = faulty_s3_root
    storage = open_storage(root)
    direct = open_storage(root, endpoint_url=moto_server)
    promote_runs(storage, root, 3)
    KeyFaults(
        s3_faults,
        monkeypatch,
        "models/demo-lm/production.json",
        actions={1: "reset_after"},
        before={2: lambda: rollback(direct, root, "demo-lm", 1, reason="v2 too", by="bob")},
    )

    result = rollback(storage, root, "demo-lm", 2, reason="v3 answers in German", by="alice")

    assert (result["changed"], result["previous_version"], result["production_version"]) == (True, 3, 1)
    history = read_production(storage, root, "demo-lm")["history"]
    assert [(h["version"], h.get("from_version"), h.get("by")) for h in history[3:]] == [
        (2, 3, "alice"),
        (1, 2, "bob"),
    ]


def test_a_rollback_that_failed_in_doubt_is_found_in_the_pointer(file_root):
    storage = open_storage(file_root)
    promote_runs(storage, file_root, 3)
    outage = OutageAfterWrite(storage, production_pointer(file_root, "demo-lm"))
    result = rollback(outage, file_root, "demo-lm", 2, reason="r", by="alice")
    assert outage.failed == 1
    assert (result["changed"], result["previous_version"]) == (True, 3)
    assert len(read_production(storage, file_root, "demo-lm")["history"]) == 4


def test_a_rollback_that_failed_without_effect_raises_and_changes_nothing(file_root):
    storage = open_storage(file_root)
    promote_runs(storage, file_root, 3)
    outage = OutageAfterWrite(storage, production_pointer(file_root, "demo-lm"), took_effect=False)
    with pytest.raises(StorageUnavailable, match="kept failing"):
        rollback(outage, file_root, "demo-lm", 2, reason="r", by="alice")
    assert read_production(storage, file_root, "demo-lm")["version"] == 3


def test_rolling_back_to_production_says_since_when_and_by_whom(file_root):
    storage = open_storage(file_root)
    promote_runs(storage, file_root, 3)
    first = rollback(storage, file_root, "demo-lm", 2, reason="r", by="alice", via="ops/run-1/rollback")
    again = rollback(storage, file_root, "demo-lm", 2, reason="r", by="alice", via="ops/run-1/rollback")
    assert (again["changed"], again["previous_version"], again["production_version"]) == (False, 2, 2)
    assert again["since"] == read_production(storage, file_root, "demo-lm")["history"][-1]
    assert (again["since"]["at"], again["since"]["via"]) == (first["at"], "ops/run-1/rollback")


@pytest.mark.parametrize("history", [{"1": {"version": 1}}, "v1", 3])
def test_a_pointer_whose_history_is_not_a_list_is_reported_not_crashed_on(file_root, history):
    storage = open_storage(file_root)
    promote_runs(storage, file_root, 2)
    uri = production_pointer(file_root, "demo-lm")
    storage.put_json(uri, {**storage.get_json(uri), "history": history})
    with pytest.raises(PromotionError) as refused:
        rollback(storage, file_root, "demo-lm", 1, reason="r", by="alice")
    assert str(refused.value).startswith(f"production pointer {uri}: field 'history' must be a list of moves")


@pytest.mark.parametrize(
    "names", [("fraud model", "fraud/model", "fraud_model"), ("модель", "данные")], ids=["ascii", "cyrillic"]
)
def test_rolling_back_one_name_never_moves_another_names_pointer(file_root, names):
    storage = open_storage(file_root)
    for name in names:
        promote_runs(storage, file_root, 2, name=name)
    others = {name: storage.get(production_pointer(file_root, name)) for name in names[1:]}
    rollback(storage, file_root, names[0], 1, reason="v2 regressed", by="alice")
    assert read_production(storage, file_root, names[0])["version"] == 1
    for name, before in others.items():
        assert storage.get(production_pointer(file_root, name)) == before
        assert read_production(storage, file_root, name)["model"] == name


def test_rolling_back_a_name_whose_folder_holds_another_models_pointer_is_refused(file_root):
    """``fraud model``'s registry from before #25 lives in ``models/fraud_model/``, the folder of
    the name ``fraud_model`` now: rolling back ``fraud_model`` must not move it."""
    storage = open_storage(file_root)
    promote_runs(storage, file_root, 2, name="fraud_model")
    uri = production_pointer(file_root, "fraud_model")
    storage.put_json(uri, {**storage.get_json(uri), "model": "fraud model"})  # as trainops wrote it then
    before = storage.get(uri)
    with pytest.raises(PromotionError) as refused:
        rollback(storage, file_root, "fraud_model", 1, reason="r", by="alice")
    assert str(refused.value).startswith(f"{uri} records model 'fraud model', not 'fraud_model': ")
    assert storage.get(uri) == before


def test_a_name_that_is_not_one_is_refused_before_storage_is_read(file_root):
    with pytest.raises(ValueError, match=r"model name 'xxxx.*\(300 characters\) is 300 characters long"):
        rollback(open_storage(file_root), file_root, "x" * 300, 1, reason="r", by="alice")
