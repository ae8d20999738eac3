import json

import numpy as np
import pytest

from trainer.storage import open_storage
from trainops.staging.assets import (
    ASSET_ALIAS,
    asset_name,
    asset_uri,
    event_extra,
    is_runtime_name,
)
from trainops.staging.demo_data import write_demo_dataset
from trainops.staging.stage import stage_dataset


@pytest.mark.parametrize(
    "dataset, name, uri",
    [
        ("demo", "trainops-dataset-demo", "trainops://datasets/demo"),
        ("web.v2_en-US=1", "trainops-dataset-web.v2_en-US=1", "trainops://datasets/web.v2_en-US=1"),
        (  # another name's folder would be news_en_2024_q1: the hash keeps them apart
            "news/en 2024:q1",
            "trainops-dataset-news_en_2024_q1~72c0a8f37231",
            "trainops://datasets/news_en_2024_q1~72c0a8f37231",
        ),
    ],
)
def test_names_and_uris_are_path_safe_like_the_storage_layout(dataset, name, uri):
    assert (asset_name(dataset), asset_uri(dataset)) == (name, uri)


def test_an_empty_dataset_name_has_no_asset():
    with pytest.raises(ValueError, match="a layout segment must not be empty"):
        asset_uri("")


def test_the_alias_is_the_documented_name():
    # DAGs of users that stage runtime names are scheduled through this alias.
    assert ASSET_ALIAS == "trainops-datasets"


class _XComLike:
    """Stands for an XComArg: the name is resolved when the task runs."""


@pytest.mark.parametrize(
    "dataset, runtime",
    [
        ("demo", False),
        ("{{ params.dataset }}", True),
        ("news-{{ ds_nodash }}", True),
        ("{% if params.full %}full{% else %}sample{% endif %}", True),
        ("curly{braces}", False),
        (_XComLike(), True),
        (None, True),
    ],
)
def test_a_template_or_an_xcom_is_a_runtime_name(dataset, runtime):
    assert is_runtime_name(dataset) is runtime


RESULT = {
    "dataset_name": "demo",
    "version": "v-3f2a",
    "uri": "s3://bucket/root/datasets/demo/v-3f2a",
    "manifest_uri": "s3://bucket/root/datasets/demo/v-3f2a/manifest.json",
    "rows": np.int64(990),
    "train_tokens": np.int64(90000),
    "eval_tokens": 10000,
    "reused": np.bool_(False),
    "validation_uri": "s3://bucket/root/datasets/demo/v-3f2a/validation.json",
    "quarantined_rows": 10,
}


def test_the_event_extra_holds_json_values_and_the_total_tokens():
    extra = event_extra(RESULT)
    assert extra == {
        "dataset_name": "demo",
        "version": "v-3f2a",
        "rows": 990,
        "tokens": 100000,
        "train_tokens": 90000,
        "eval_tokens": 10000,
        "uri": "s3://bucket/root/datasets/demo/v-3f2a",
        "manifest_uri": "s3://bucket/root/datasets/demo/v-3f2a/manifest.json",
        "reused": False,
        "quarantined_rows": 10,
    }
    assert json.loads(json.dumps(extra)) == extra
    assert [type(extra[k]) for k in ("rows", "tokens", "reused")] == [int, int, bool]


def test_a_result_without_quarantine_counts_none_quarantined():
    result = {k: v for k, v in RESULT.items() if k != "quarantined_rows"}
    assert event_extra(result)["quarantined_rows"] == 0


def test_the_extra_of_a_staging_result_points_the_trainer_at_the_version(file_root, raw_uri):
    source = write_demo_dataset(raw_uri, rows=120, seed=2, files=1)
    result = stage_dataset(open_storage(file_root), file_root, source["uri"], "demo")
    extra = event_extra(result)
    assert extra["uri"] == result["uri"] and extra["version"] == result["version"]
    assert extra["rows"] == 120
    assert extra["tokens"] == result["train_tokens"] + result["eval_tokens"] > 0
    assert (extra["reused"], extra["quarantined_rows"]) == (False, 0)
