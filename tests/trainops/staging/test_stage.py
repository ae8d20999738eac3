import hashlib
import json

import pytest

from tests.trainops.staging.helpers import assert_nothing_valid_looking, snapshot
from trainer.contract import dataset_prefix, join, safe_segment
from trainer.storage import FileStorage, open_storage
from trainops.staging.demo_data import demo_rows, write_demo_dataset
from trainops.staging.errors import DataValidationError, SourceNotFound, StagingError
from trainops.staging.stage import stage_dataset
from trainops.staging.tokenize import decode

ROWS = 1200


def _check_staged(storage, result, texts_by_id):
    manifest = storage.get_json(result["manifest_uri"])
    assert result["manifest_uri"] == join(result["uri"], "manifest.json")
    assert manifest["version"] == result["version"]
    assert manifest["rows"] == {
        "total": ROWS,
        "train": manifest["rows"]["train"],
        "eval": manifest["rows"]["eval"],
    }
    assert manifest["rows"]["train"] + manifest["rows"]["eval"] == ROWS == result["rows"]
    streams = {}
    for split in ("train", "eval"):
        info = manifest["splits"][split]
        data = b""
        for shard in info["shards"]:
            blob = storage.get(join(result["uri"], shard["path"]))
            assert hashlib.sha256(blob).hexdigest() == shard["sha256"]
            assert len(blob) == 2 * shard["tokens"]
            data += blob
        assert len(data) // 2 == info["tokens"] == result[f"{split}_tokens"]
        streams[split] = data
    # every record's bytes plus EOS, nothing lost or added
    total = sum(len(t.encode()) + 1 for t in texts_by_id.values())
    assert result["train_tokens"] + result["eval_tokens"] == total
    index = [
        json.loads(line)
        for line in storage.get(join(result["uri"], "eval/index.jsonl")).decode().splitlines()
    ]
    assert len(index) == manifest["eval_index"]["records"] == manifest["rows"]["eval"]
    assert [r["start"] for r in index[1:]] == [r["end"] for r in index[:-1]]
    assert index[-1]["end"] == result["eval_tokens"]
    eval_texts = decode(streams["eval"])
    for rec, text in zip(index, eval_texts, strict=False):
        assert texts_by_id[rec["id"]] == text
        assert rec["source"] in {"news", "forum", "docs"}
    assert storage.get_json(join(result["uri"], "validation.json"))["success"] is True
    return manifest


def test_stage_on_file_storage_then_reuse(file_root, raw_uri):
    source = write_demo_dataset(raw_uri, rows=ROWS, seed=5)
    storage = open_storage(file_root)
    result = stage_dataset(storage, file_root, source["uri"], "demo", shard_tokens=8192)
    json.dumps(result)
    assert result["reused"] is False
    assert result["uri"] == dataset_prefix(file_root, "demo", result["version"])
    cols = demo_rows(ROWS, seed=5)
    manifest = _check_staged(storage, result, dict(zip(cols["id"], cols["text"], strict=False)))
    assert len(manifest["splits"]["train"]["shards"]) > 3
    assert 0.06 < manifest["rows"]["eval"] / ROWS < 0.14
    # only the committed version remains: no temporary prefix left behind
    assert {
        u.split("/datasets/demo/")[1].split("/")[0] for u in storage.list(join(file_root, "datasets"))
    } == {result["version"]}

    before = snapshot(storage, file_root)
    again = stage_dataset(storage, file_root, source["uri"], "demo", shard_tokens=8192)
    assert again == dict(result, reused=True)
    assert snapshot(storage, file_root) == before

    other = stage_dataset(storage, file_root, source["uri"], "demo", shard_tokens=8192, eval_percent=20)
    assert other["version"] != result["version"] and other["reused"] is False


def test_stage_on_s3(s3_root):
    raw = s3_root.replace("/root", "/raw")
    source = write_demo_dataset(raw, rows=ROWS, seed=6)
    storage = open_storage(s3_root)
    result = stage_dataset(storage, s3_root, source["uri"], "demo-s3", shard_tokens=16384)
    assert result["uri"].startswith(s3_root + "/datasets/demo-s3/")
    cols = demo_rows(ROWS, seed=6)
    _check_staged(storage, result, dict(zip(cols["id"], cols["text"], strict=False)))
    assert not [u for u in storage.list(s3_root) if "_staging-" in u]
    again = stage_dataset(storage, s3_root, source["uri"], "demo-s3", shard_tokens=16384)
    assert again == dict(result, reused=True)


def test_bad_data_raises_lists_failures_and_keeps_only_the_report(file_root, raw_uri, tmp_path):
    storage = open_storage(file_root)
    good = write_demo_dataset(raw_uri, rows=300, seed=1)
    stage_dataset(storage, file_root, good["uri"], "demo")
    bad = write_demo_dataset(f"file://{tmp_path}/bad", rows=ROWS, seed=1, corrupt=True)
    before = snapshot(storage, file_root)
    with pytest.raises(DataValidationError) as err:
        stage_dataset(storage, file_root, bad["uri"], "demo")
    added = assert_nothing_valid_looking(storage, file_root, before)
    assert added == [err.value.report_uri]
    assert err.value.report_uri.endswith("/validation.json")
    report = storage.get_json(err.value.report_uri)
    assert report["success"] is False and report["rows"] == ROWS
    assert [r["success"] for r in report["results"]] == [False, False, True, False, True, True]
    message = str(err.value)
    assert message.endswith(f"Full report: {err.value.report_uri}")
    assert "failed 3 of 6 expectations over 1200 rows, so nothing was staged" in message
    assert "expect_column_values_to_not_be_null on 'id': 2 unexpected (rows 3, 400)" in message
    assert (
        "expect_column_values_to_be_unique on 'id': 4 unexpected (ids 'f001-0000001', 'n001-0000000')"
    ) in message
    assert "expect_column_value_lengths_to_be_between on 'text': 3 unexpected" in message
    failed = {f["expectation"]: f for f in err.value.summary["failed"]}
    assert failed["expect_column_value_lengths_to_be_between"]["unexpected_count"] == 3


def test_missing_source_is_named(file_root, tmp_path):
    storage = open_storage(file_root)
    missing = f"file://{tmp_path}/nowhere"
    with pytest.raises(SourceNotFound, match=f"source_uri '{missing}' does not exist"):
        stage_dataset(storage, file_root, missing, "demo")


def test_missing_slice_column_is_named(file_root, raw_uri):
    source = write_demo_dataset(raw_uri, rows=60, seed=2, files=1)
    with pytest.raises(StagingError, match=r"lacks columns \['lang'\]"):
        stage_dataset(
            open_storage(file_root), file_root, source["uri"], "demo", slice_columns=["source", "lang"]
        )


class _CrashOnManifest(FileStorage):
    def put(self, uri, data, **conditions):
        if uri.endswith("/manifest.json"):
            raise OSError("simulated crash before the commit point")
        return super().put(uri, data, **conditions)


def test_a_crash_before_the_manifest_leaves_no_version_and_a_rerun_commits(file_root, raw_uri):
    source = write_demo_dataset(raw_uri, rows=300, seed=3)
    with pytest.raises(OSError, match="simulated crash"):
        stage_dataset(_CrashOnManifest(), file_root, source["uri"], "demo")
    storage = open_storage(file_root)
    left = storage.list(file_root)
    assert left and not [u for u in left if u.endswith("manifest.json") or "_staging-" in u]
    result = stage_dataset(storage, file_root, source["uri"], "demo")
    assert result["reused"] is False
    assert storage.exists(result["manifest_uri"])


def test_jsonl_and_csv_sources_stage_the_same_records(file_root, tmp_path):
    cols = demo_rows(90, seed=4)
    lines = [
        json.dumps({"id": i, "text": t, "source": s})
        for i, t, s in zip(cols["id"], cols["text"], cols["source"], strict=False)
    ]
    storage = open_storage(file_root)
    storage.put(f"file://{tmp_path}/j/data.jsonl", ("\n".join(lines) + "\n").encode())
    csv = "id,text,source\n" + "".join(
        f'{i},"{t}",{s}\n' for i, t, s in zip(cols["id"], cols["text"], cols["source"], strict=False)
    )
    storage.put(f"file://{tmp_path}/c/data.csv", csv.encode())
    from_jsonl = stage_dataset(storage, file_root, f"file://{tmp_path}/j/data.jsonl", "j")
    from_csv = stage_dataset(storage, file_root, f"file://{tmp_path}/c", "c")
    for result in (from_jsonl, from_csv):
        assert result["rows"] == 90
        assert result["train_tokens"] + result["eval_tokens"] == sum(
            len(t.encode()) + 1 for t in cols["text"]
        )
    eval_j = storage.get(join(from_jsonl["uri"], "eval/index.jsonl"))
    assert eval_j == storage.get(join(from_csv["uri"], "eval/index.jsonl"))


@pytest.mark.parametrize(
    "names", [("fraud data", "fraud_data"), ("данные", "датчик")], ids=["ascii", "cyrillic"]
)
def test_names_that_once_shared_a_folder_each_stage_into_a_folder_of_their_own(file_root, raw_uri, names):
    source = write_demo_dataset(raw_uri, rows=100, seed=5)
    storage = open_storage(file_root)
    results = [stage_dataset(storage, file_root, source["uri"], name) for name in names]
    assert [r["reused"] for r in results] == [False, False]  # the same data, staged once for each name
    assert len({r["uri"] for r in results}) == 2
    for name, result in zip(names, results, strict=True):
        assert result["uri"] == dataset_prefix(file_root, name, result["version"])
        assert storage.get_json(result["manifest_uri"])["name"] == result["dataset_name"] == name


def test_a_folder_holding_another_datasets_manifest_is_refused_naming_both(file_root, raw_uri):
    """``fraud data``'s versions from before #25 live in ``datasets/fraud_data/``, the folder of the
    name ``fraud_data`` now: staging ``fraud_data`` must not reuse them as its own."""
    source = write_demo_dataset(raw_uri, rows=100, seed=5)
    storage = open_storage(file_root)
    first = stage_dataset(storage, file_root, source["uri"], "fraud_data")
    storage.put_json(first["manifest_uri"], {**storage.get_json(first["manifest_uri"]), "name": "fraud data"})
    before = snapshot(storage, file_root)

    with pytest.raises(StagingError) as refused:
        stage_dataset(storage, file_root, source["uri"], "fraud_data")

    assert str(refused.value) == (
        f"{first['manifest_uri']} records dataset 'fraud data', not 'fraud_data': this folder holds "
        "'fraud data''s versions (trainops before #25 gave both names this folder; it now stages 'fraud "
        f"data' in {file_root}/datasets/{safe_segment('fraud data')}/), so 'fraud_data' may not use it; "
        "nothing was staged. Give 'fraud_data' another name, or move 'fraud data''s versions out of "
        "this folder first"
    )
    assert snapshot(storage, file_root) == before


# --- task sft: prompt/response records ------------------------------------------------------------
def sft_source(storage, folder: str, count: int = 200, **bad: dict) -> str:
    """A JSONL source of prompt/response records (``bad``: fields to override, by record index)."""
    from tests.trainer.helpers import instructions

    rows = [{"id": f"q{i}", "prompt": p, "response": r} for i, (p, r) in enumerate(instructions(count, 3))]
    for index, fields in bad.items():
        rows[int(index.removeprefix("row"))].update(fields)
    storage.put(f"{folder}/data.jsonl", "".join(json.dumps(r) + "\n" for r in rows).encode())
    return f"{folder}/data.jsonl"


def test_an_sft_source_stages_one_record_per_sample_with_its_prompt_length_and_the_trainer_reads_it(
    file_root, tmp_path
):
    import numpy as np

    from tests.trainer.helpers import instructions
    from trainer.records import check_records, read_records

    storage = open_storage(file_root)
    source = sft_source(storage, f"file://{tmp_path}/raw")
    result = stage_dataset(storage, file_root, source, "instructions", task="sft")
    manifest = storage.get_json(result["manifest_uri"])
    assert manifest["task"] == {"kind": "sft"} and manifest["eval_index"]["slice_columns"] == []
    pairs = dict(instructions(200, 3))
    seen = 0
    for split in ("train", "eval"):
        info = manifest["splits"][split]
        stream = b"".join(storage.get(join(result["uri"], s["path"])) for s in info["shards"])
        tokens = np.frombuffer(stream, dtype="<u2")
        rows = read_records(storage, result["uri"], manifest, split)  # the trainer's own reader
        check_records(rows, len(tokens), result["uri"])
        assert len(rows) == info["records"]["count"] == manifest["rows"][split]
        for first, length, prompt in rows.tolist():
            record = tokens[first : first + length]
            assert record[-1] == 256  # one end of record, after the response
            text = bytes(record[:-1].astype(np.uint8)).decode()
            assert pairs[text[:prompt]] == text[prompt:]  # the prompt, then its own response
        seen += len(rows)
    assert seen == 200


# --- task classification: text/label records ----------------------------------------------------
def labelled_source(storage, folder: str, count: int = 200, **bad: dict) -> str:
    """A JSONL source of text/label records (``bad``: fields to override, by record index)."""
    from tests.trainer.helpers import labelled

    rows = [{"id": f"k{i}", "text": t, "label": k} for i, (_, t, k) in enumerate(labelled(count, 5))]
    for index, fields in bad.items():
        rows[int(index.removeprefix("row"))].update(fields)
    storage.put(f"{folder}/data.jsonl", "".join(json.dumps(r) + "\n" for r in rows).encode())
    return f"{folder}/data.jsonl"


def test_a_classification_source_stages_its_labels_and_one_record_per_text_the_trainer_reads(
    file_root, tmp_path
):
    import numpy as np

    from tests.trainer.helpers import LABELS, labelled
    from trainer.contract import dataset_labels
    from trainer.records import check_records, read_records

    storage = open_storage(file_root)
    source = labelled_source(storage, f"file://{tmp_path}/raw")
    result = stage_dataset(storage, file_root, source, "kinds", task="classification")
    manifest = storage.get_json(result["manifest_uri"])
    assert manifest["task"] == {"kind": "classification", "labels": LABELS}  # the data's, sorted
    assert dataset_labels(manifest) == LABELS
    truth = {text: label for _, text, label in labelled(200, 5)}
    seen = 0
    for split in ("train", "eval"):
        info = manifest["splits"][split]
        tokens = np.frombuffer(
            b"".join(storage.get(join(result["uri"], s["path"])) for s in info["shards"]), "<u2"
        )
        rows = read_records(storage, result["uri"], manifest, split)
        check_records(rows, len(tokens), result["uri"], len(LABELS))
        for first, length, label in rows.tolist():
            record = tokens[first : first + length]
            assert record[-1] == 256  # the byte tokenizer frames a text with its end
            assert LABELS[label] == truth[bytes(record[:-1].astype(np.uint8)).decode()]
        seen += len(rows)
    assert seen == 200


def test_a_fixed_label_set_keeps_its_order_and_a_record_outside_it_is_refused_or_quarantined(
    file_root, tmp_path
):
    import numpy as np

    from trainer.contract import dataset_labels
    from trainer.records import read_records

    storage = open_storage(file_root)
    fixed = ["person", "machine", "animal", "plant"]  # not sorted, and one the data never holds
    source = labelled_source(storage, f"file://{tmp_path}/raw", 60)
    result = stage_dataset(storage, file_root, source, "kinds", task="classification", labels=fixed)
    manifest = storage.get_json(result["manifest_uri"])
    assert dataset_labels(manifest) == fixed
    rows = np.concatenate([read_records(storage, result["uri"], manifest, s) for s in ("train", "eval")])
    assert set(rows[:, 2].tolist()) == {0, 1, 2}  # indices into the fixed set; no plant
    derived = stage_dataset(storage, file_root, source, "kinds", task="classification")
    assert derived["version"] != result["version"]  # the label set decides the records
    odd = labelled_source(storage, f"file://{tmp_path}/odd", 60, row5={"id": "k5", "label": "mineral"})
    with pytest.raises(
        StagingError,
        match=r"record 'k5' \(row 5\) has label 'mineral', which is not in the label set \['person'",
    ):
        stage_dataset(storage, file_root, odd, "odd", task="classification", labels=fixed)
    kept = stage_dataset(
        storage,
        file_root,
        odd,
        "odd",
        task="classification",
        labels=fixed,
        quarantine={"max_fraction": 0.1, "sample_rows": 5},
    )
    assert kept["quarantined_rows"] == 1 and kept["rows"] == 59


def test_a_source_with_one_label_is_refused_and_an_imbalanced_one_warned_naming_the_counts(
    file_root, tmp_path, caplog
):
    import logging

    storage = open_storage(file_root)
    one = labelled_source(
        storage, f"file://{tmp_path}/one", 30, **{f"row{i}": {"label": "spam"} for i in range(30)}
    )
    with pytest.raises(
        StagingError, match=r"has 1 label\(s\) \['spam'\] in its 'label' column: a classifier needs two"
    ):
        stage_dataset(storage, file_root, one, "one", task="classification")
    skewed = labelled_source(
        storage,
        f"file://{tmp_path}/skewed",
        120,
        **{f"row{i}": {"label": "ham" if i else "spam"} for i in range(120)},
    )
    with caplog.at_level(logging.WARNING):
        stage_dataset(storage, file_root, skewed, "skewed", task="classification")
    assert (
        "dataset skewed is imbalanced: 119 records labelled 'ham', 1 labelled 'spam' (over 10x)"
        in caplog.text
    )
    nulls = labelled_source(storage, f"file://{tmp_path}/nulls", 50, row3={"label": None})
    with pytest.raises(DataValidationError, match=r"label"):
        stage_dataset(storage, file_root, nulls, "nulls", task="classification")


def test_an_sft_source_without_a_response_or_with_an_empty_one_is_refused_naming_it(file_root, tmp_path):
    storage = open_storage(file_root)
    missing = f"file://{tmp_path}/missing"
    storage.put(f"{missing}/data.jsonl", b'{"id": "a", "prompt": "hi"}\n')
    with pytest.raises(StagingError, match=r"lacks columns \['response'\]"):
        stage_dataset(storage, file_root, missing, "m", task="sft")
    empty = sft_source(storage, f"file://{tmp_path}/empty", 50, row7={"response": ""})
    with pytest.raises(DataValidationError, match=r"response"):
        stage_dataset(storage, file_root, empty, "e", task="sft")
