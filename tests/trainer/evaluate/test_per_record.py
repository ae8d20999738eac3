"""Each eval record's own figures beside the report (trainer.evaluate.per_record): the same
units in the same order for both models, and sums whose ratio is the report's loss."""

from __future__ import annotations

import json

import numpy as np

from trainer.evaluate.per_record import document, owner_loss_sums, record_loss_sums, records_uri

NAN = np.nan


def test_the_file_sits_beside_its_report():
    assert records_uri("s3://b/runs/r/eval/metrics.json") == "s3://b/runs/r/eval/metrics.records.json"
    assert records_uri("file:///tmp/out") == "file:///tmp/out.records.json"


def test_a_records_loss_is_the_sum_over_its_scored_tokens_and_none_without_one():
    losses = np.array([NAN, 1.0, 2.0, NAN, 4.0, NAN, NAN])
    owners = np.array([0, 0, 0, 1, 1, -1, 2])  # record 2 has no scored token; position 5 no record
    sums, tokens = owner_loss_sums(losses, owners, 3)
    np.testing.assert_array_equal(sums, [3.0, 4.0, NAN])
    np.testing.assert_array_equal(tokens, [2.0, 1.0, NAN])
    rows = np.array([[0, 3, 1], [3, 2, 1], [5, 2, 1]])  # (start, length, prompt)
    by_rows = record_loss_sums(losses, rows)
    np.testing.assert_array_equal(by_rows[0], [3.0, 4.0, NAN])
    # the ratio of sums over every record is the mean over every scored token
    assert np.nansum(sums) / np.nansum(tokens) == np.nanmean(losses)


def test_the_document_is_json_with_null_for_what_a_model_did_not_score():
    candidate = {"exact": np.array([1.0, 0.0, NAN])}
    baseline = {"exact": np.array([0.0, NAN, 1.0])}
    body = document(True, [candidate, baseline], ["file:///c", "file:///b"])
    assert json.loads(json.dumps(body, allow_nan=False)) == {
        "format": "trainops.eval-records/v1",
        "unit": "eval record",
        "count": 3,
        "candidate_uri": "file:///c",
        "baseline_uri": "file:///b",
        "candidate": {"exact": [1.0, 0.0, None]},
        "baseline": {"exact": [0.0, None, 1.0]},
    }
    assert document(False, [candidate], ["file:///c"])["unit"] == "eval index record"
    assert document(False, [candidate], ["file:///c"])["baseline"] is None
