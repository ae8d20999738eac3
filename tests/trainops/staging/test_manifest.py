import pytest

from trainer.contract import MANIFEST_FORMAT
from trainops.staging.errors import StagingError
from trainops.staging.manifest import build_manifest, check_manifest_name, shard_paths
from trainops.staging.tokenize import TOKENIZER, split_rule


def _args(**changes):
    args = {
        "name": "demo",
        "version": "3f2a9c0d1b2e",
        "created_at": "2026-01-01T00:00:00+00:00",
        "source_uri": "file:///raw",
        "objects": [{"uri": "file:///raw/a.parquet", "size": 1, "etag": "e"}],
        "tokenizer": TOKENIZER,
        "token_dtype": "uint16",
        "splits": {
            "train": {
                "tokens": 12,
                "shards": [
                    {"path": "train/00000.bin", "tokens": 8, "sha256": "s0"},
                    {"path": "train/00001.bin", "tokens": 4, "sha256": "s1"},
                ],
            },
            "eval": {"tokens": 3, "shards": [{"path": "eval/00000.bin", "tokens": 3, "sha256": "s2"}]},
        },
        "split_rule": split_rule(10),
        "eval_records": 1,
        "slice_columns": ["source"],
        "rows": {"total": 4, "train": 3, "eval": 1},
        "validation": {"success": True},
    }
    args.update(changes)
    return args


def test_manifest_has_the_format_the_trainer_reads():
    m = build_manifest(**_args())
    assert m["format"] == MANIFEST_FORMAT
    assert set(m) == {
        "format",
        "name",
        "version",
        "created_at",
        "source",
        "tokenizer",
        "token_dtype",
        "splits",
        "split_rule",
        "eval_index",
        "rows",
        "validation",
    }
    assert m["tokenizer"] == {"kind": "byte", "vocab_size": 257, "eos_id": 256}
    assert m["splits"]["train"]["tokens"] == 12
    assert m["eval_index"] == {"path": "eval/index.jsonl", "records": 1, "slice_columns": ["source"]}
    assert m["split_rule"] == {"kind": "id_hash", "hash": "sha256", "eval_percent": 10}
    assert shard_paths(m) == ["train/00000.bin", "train/00001.bin", "eval/00000.bin", "eval/index.jsonl"]


def test_inconsistent_counts_are_refused():
    bad = _args()
    bad["splits"]["train"]["tokens"] = 13
    with pytest.raises(ValueError, match="split 'train' claims 13 tokens but its shards hold 12"):
        build_manifest(**bad)
    with pytest.raises(ValueError, match="row counts do not add up"):
        build_manifest(**_args(rows={"total": 5, "train": 3, "eval": 1}))


def test_quarantine_is_recorded_only_when_it_was_on():
    block = {
        "rows": 2,
        "rows_read": 6,
        "fraction": 0.333333,
        "max_fraction": 0.5,
        "by_reason": {"expect_column_values_to_not_be_null(text)": 2},
        "sample": "quarantine/sample.jsonl",
        "sample_rows": 2,
    }
    assert "quarantine" not in build_manifest(**_args())
    assert build_manifest(**_args(quarantine=block))["quarantine"] == block


@pytest.mark.parametrize("manifest", [{"name": "demo"}, {"format": MANIFEST_FORMAT}, None])
def test_a_manifest_of_the_name_or_of_no_name_belongs_to_the_folder(manifest):
    check_manifest_name(manifest, "demo", "s3://b/datasets/demo/v1/manifest.json")  # raises otherwise


def test_a_manifest_of_another_name_is_refused_naming_both_and_where_it_belongs():
    with pytest.raises(StagingError) as refused:
        check_manifest_name(
            {"name": "demo data"}, "demo_data", "s3://b/t/datasets/demo_data/v1/manifest.json"
        )
    message = str(refused.value)
    assert message.startswith(
        "s3://b/t/datasets/demo_data/v1/manifest.json records dataset 'demo data', not 'demo_data': "
    )
    assert "it now stages 'demo data' in s3://b/t/datasets/demo_data~b39fc3131b54/)" in message
    assert message.endswith(
        "Give 'demo_data' another name, or move 'demo data''s versions out of this folder first"
    )
