"""The checks of the stored records that pages and commands read: the writers' records pass,
older ones too, and a damaged one is refused naming the file, the field and what was expected.
(Every page and command over damaged records: ``tests/trainops/test_damaged_records.py``.)"""

from __future__ import annotations

import copy
import json

import pytest

from tests.trainops.cost.fixtures import FIXTURE_PRICES, one_preemption_job
from tests.trainops.registry.helpers import promote_runs
from tests.trainops.reports.test_card_page import CARD
from trainer.contract import join, model_version_prefix, production_pointer
from trainer.storage import open_storage
from trainops.cost.accounting import account
from trainops.shapes import (
    ShapeError,
    check_card,
    check_for,
    check_job,
    check_manifest,
    check_pointer,
    load,
)
from trainops.staging.manifest import build_manifest

JOB_URI = "s3://b/root/runs/retrain/r1/train/job.json"


def _job() -> dict:
    job, metrics = one_preemption_job()
    return json.loads(json.dumps({**job, "cost": dict(account(job, metrics, FIXTURE_PRICES))}))


def _manifest() -> dict:
    shards = {
        s: {"tokens": 10, "shards": [{"path": f"{s}/00000.bin", "tokens": 10}]} for s in ("train", "eval")
    }
    return build_manifest(
        name="web-text",
        version="aaa111",
        created_at="2026-01-01T00:00:00+00:00",
        source_uri="file:///raw",
        objects=[],
        tokenizer={"kind": "byte"},
        token_dtype="uint16",
        splits=shards,
        split_rule={"kind": "hash"},
        eval_records=1,
        slice_columns=["source"],
        rows={"total": 2, "train": 1, "eval": 1},
        validation={"success": True},
    )


def _refused(check, data: object, uri: str = JOB_URI, **kwargs) -> ShapeError:
    with pytest.raises(ShapeError) as caught:
        check(data, uri, **kwargs)
    return caught.value


def test_the_records_as_their_writers_write_them_pass(file_root):
    job = _job()
    assert check_job(job, JOB_URI) is job and check_job(job, JOB_URI, complete=True) is job
    assert check_card(CARD, "s3://b/root/models/m/versions/3/card.json") is CARD
    assert check_manifest(_manifest(), "file:///d/manifest.json")["name"] == "web-text"
    storage = open_storage(file_root)
    promote_runs(storage, file_root, 2)
    storage_root = file_root
    from trainops.registry.rollback import rollback

    rollback(storage, storage_root, "demo-lm", 1, reason="r", by="ada", via="d/r/t")
    pointer = storage.get_json(production_pointer(file_root, "demo-lm"))
    assert check_pointer(pointer, "x")["version"] == 1
    card = storage.get_json(join(model_version_prefix(file_root, "demo-lm", 1), "card.json"))
    assert check_card(card, "x") is card


def test_older_and_sparse_records_pass_where_their_readers_show_what_is_missing():
    assert check_card({}, "c") == {}
    assert check_card({"model": "old", "version": 1, "training_cost": None, "lineage": {"parent": None}}, "c")
    # every pointer trainops wrote names its version and that version's folder
    sparse = {"version": 3, "uri": "s3://b/models/m/versions/3"}
    assert check_pointer(sparse, "p") == {**sparse, "history": []}
    # a job.json as an older operator wrote it: no budget, cost or airflow ids; pages read it
    job = _job()
    for key in ("budget", "cost"):
        job.pop(key)
    job["attempts"][0].pop("nodes")
    assert check_job(job, JOB_URI) is job
    # a field of a newer writer is left alone; so is a bill of another format
    assert check_job({**job, "owner": {"any": "thing"}, "cost": {"format": "x/v9", "cost": "?"}}, JOB_URI)


def test_a_damaged_field_is_named_with_what_was_expected_and_what_was_found():
    job = _job()
    job["attempts"][1]["node_types"][0]["instance_type"] = ["p4d"]
    error = _refused(check_job, job)
    assert (error.uri, error.field, error.expected, error.got) == (
        JOB_URI,
        "attempts[1].node_types[0].instance_type",
        "a string or null",
        "a list of 1 item(s)",
    )
    assert str(error) == (
        f"{JOB_URI}: field 'attempts[1].node_types[0].instance_type' should be a string or null, got a "
        "list of 1 item(s); the run's record is damaged: restore it, or move it aside to start the run's "
        "bookkeeping afresh"
    )
    assert isinstance(error, ValueError)  # callers that report a ValueError report this too

    job = _job()
    job["cost"]["attempts"][0]["spans"][2]["end"] = "soon"
    assert _refused(check_job, job).field == "cost.attempts[0].spans[2].end"
    job = _job()
    job["preemptions"] = True  # JSON's true is no count
    assert (_refused(check_job, job).field, _refused(check_job, job).got) == ("preemptions", "true")
    job["preemptions"] = float("nan")
    assert _refused(check_job, job).got == "NaN"
    job["preemptions"] = "x" * 200
    assert _refused(check_job, job).got == 'the text "' + "x" * 55 + '..."'


def test_a_command_that_accounts_needs_every_field_the_accounting_reads():
    job = _job()
    job["attempts"][0].pop("nodes")
    error = _refused(check_job, job, complete=True)
    assert (error.field, error.expected, error.got) == (
        "attempts[0].nodes",
        "a whole number",
        "nothing (the field is missing)",
    )
    job = _job()
    del job["cost"]["seconds"]["shutdown"]
    assert _refused(check_job, job, complete=True).field == "cost.seconds.shutdown"
    job = _job()
    for phase in ("restart", "rollback"):  # a bill from before restarts in place and rollbacks
        job["cost"]["seconds"].pop(phase, None)
    assert check_job(job, JOB_URI, complete=True)
    job = _job()
    del job["status"]
    assert _refused(check_job, job, complete=True).field == "status"
    assert check_job(job, JOB_URI)  # a page shows the status as unknown


def test_every_kind_refuses_another_json_value_and_a_manifest_another_format():
    for check, what in (
        (check_job, "a training run's record"),
        (check_card, "a model version's card"),
        (check_pointer, "a production pointer"),
        (check_manifest, "a dataset manifest"),
    ):
        error = _refused(check, [1, 2], "file:///r/x.json")
        assert (error.field, error.expected, error.got) == (
            None,
            f"a JSON object ({what})",
            "a list of 2 item(s)",
        )
        assert str(error).startswith(f"file:///r/x.json should hold a JSON object ({what}), got a list")
    error = _refused(check_manifest, {**_manifest(), "format": "other/v2"}, "file:///d/manifest.json")
    assert (error.field, error.expected, error.got) == (
        "format",
        '"trainops.dataset/v1"',
        'the text "other/v2"',
    )
    assert str(error).endswith("the dataset version's manifest is damaged: stage the dataset again")
    manifest = _manifest()
    del manifest["splits"]["eval"]
    assert _refused(check_manifest, manifest).field == "splits.eval"
    pointer = {
        "version": 2,
        "uri": "s3://b/m/versions/2",
        "history": [{"version": 1, "action": "promote"}, "x"],
    }
    assert _refused(check_pointer, pointer).field == "history[1]"
    card = copy.deepcopy(CARD)
    card["files"][1] = {"size": 3}
    assert str(_refused(check_card, card, "c")).startswith(
        "c: field 'files[1].path' should be a string, got nothing (the field is missing); the version's "
        "card is damaged"
    )


def test_load_names_a_file_that_is_cut_short():
    data = json.dumps(_job()).encode()
    assert load(data, JOB_URI, check_job)["status"] == "succeeded"
    error = _refused(lambda d, u: load(d, u, check_job), data[:40])
    assert (error.field, error.expected) == (None, "valid JSON")
    assert str(error).startswith(f"{JOB_URI} is not valid JSON (Unterminated string starting at: line 1")
    assert ", perhaps cut short; the run's record is damaged" in str(error)


def test_the_check_of_a_stored_object_is_found_by_where_it_lies():
    assert check_for("s3://b/runs/d/r/t/job.json") is check_job
    assert check_for("s3://b/models/m/versions/3/card.json") is check_card
    assert check_for("s3://b/models/m/production.json") is check_pointer
    assert check_for("s3://b/datasets/d/v1/manifest.json") is check_manifest
    for other in (
        "s3://b/runs/d/r/t/eval/gate.json",
        "s3://b/runs/d/r/t/export/card.json",
        "s3://b/runs/d/r/t/production.json",
        "s3://b/runs/d/r/t/export/manifest.json",
    ):
        assert check_for(other) is None, other
