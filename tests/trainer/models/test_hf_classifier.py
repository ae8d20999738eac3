"""A Hugging Face encoder classifier (``task.kind: classification``, ``model.hf_config`` of a
BERT) through the whole trainer: 2 CPU ranks under torchrun, the dataset's labels pinned into
the model, checkpoints, an exact resume after a SIGTERM and a SIGKILL (dropout included), the
export that ``transformers`` loads alone as a ``BertForSequenceClassification`` with the labels,
and its evaluation (accuracy, macro F1).

The model is a tiny BERT, trained on labelled templated sentences (``tests.trainer.helpers.
write_classification_dataset``); one uninterrupted run is shared by the tests.
"""

from __future__ import annotations

import subprocess

import numpy as np
import pytest
import torch

from tests.trainer.helpers import (
    INSTRUMENTED,
    LABELS,
    TINY_BERT,
    metrics_of,
    preempted_then_killed,
    read_json,
    run_config,
    torchrun_argv,
    trainer_env,
    write_classification_dataset,
)

pytestmark = pytest.mark.slow

STEPS = 12
# 64 tokens hold every record; a checkpoint every 4 steps; the export in fp32, bit for bit.
OVERRIDES = (
    "task.kind=classification",
    f"train.max_steps={STEPS}",
    "train.seq_len=64",
    "checkpoint.every_steps=4",
    "export.dtype=fp32",
    "train.lr=0.01",
    "train.warmup_steps=1",
)


@pytest.fixture(scope="module")
def kinds_dataset(tmp_path_factory) -> str:
    return write_classification_dataset(tmp_path_factory.mktemp("kinds") / "datasets" / "kinds" / "v1")


@pytest.fixture(scope="module")
def classifier_run(tmp_path_factory, kinds_dataset) -> dict:
    """An uninterrupted run of the tiny BERT classifier."""
    tmp = tmp_path_factory.mktemp("classifier")
    config, run_uri = run_config(tmp, kinds_dataset, "run", model={"hf_config": TINY_BERT})
    proc = subprocess.run(
        torchrun_argv(config, *OVERRIDES, module=INSTRUMENTED),
        env=trainer_env(tmp / "cache", 1),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return {"run_dir": tmp / "run", "run_uri": run_uri, "config": config, "stdout": proc.stdout}


def test_a_bert_classifier_trains_and_its_export_is_a_bert_classifier_with_the_labels(
    classifier_run, kinds_dataset
):
    from transformers import AutoModelForSequenceClassification

    from trainer.export.folder import load_model
    from trainer.records import PADDING
    from trainer.storage import open_storage

    run = classifier_run["run_dir"]
    assert "model: hf bert:" in classifier_run["stdout"] and ", 2 blocks" in classifier_run["stdout"]
    record = read_json(run / "attempts" / "1.json")
    assert (record["outcome"], record["last_step"], record["steps_lost"]) == ("completed", STEPS, 0)
    metrics = metrics_of(run)
    # it learned more than the labels' frequencies (1/3 animal, 1/6 machine, 1/2 person: 1.01)
    assert sum(metrics[step]["loss"] for step in range(STEPS - 3, STEPS + 1)) / 4 < 0.95 < metrics[1]["loss"]
    info = read_json(run / "export" / "export.json")
    assert (info["layout"], info["model"], info["dtype"]) == ("hf", "bert", "fp32")

    folder = run / "export"
    theirs = AutoModelForSequenceClassification.from_pretrained(folder).eval()  # transformers alone
    assert type(theirs).__name__ == "BertForSequenceClassification"
    assert theirs.config.id2label == dict(enumerate(LABELS)) and theirs.config.num_labels == 3
    ours, _ = load_model(open_storage(folder.as_uri()), folder.as_uri())
    ours.eval()
    # a batch of two records of different lengths: the shorter padded, as the trainer feeds it
    ids = torch.randint(1, 256, (2, 20), generator=torch.Generator().manual_seed(0))
    tokens = ids.clone()
    tokens[1, 12:] = PADDING
    mask = (tokens >= 0).long()
    with torch.no_grad():
        mine = ours(tokens)
        reference = theirs(input_ids=ids.masked_fill(mask == 0, 0), attention_mask=mask).logits
        alone = theirs(input_ids=ids[1:, :12]).logits
    assert mine.shape == (2, 3)
    assert (mine - reference).abs().max().item() <= 1e-5
    assert (mine[1:] - alone).abs().max().item() <= 1e-5  # the padding changes nothing


def _eval_config(run: dict, dataset_uri: str, folder, scorer: str):
    """The classifier run's evaluation config, its report at ``folder/eval.json``, with ``scorer``."""
    from trainer.config import config_from_mapping

    return config_from_mapping(
        {
            "run_uri": run["run_uri"],
            "data_uri": dataset_uri,
            "task": {"kind": "classification"},
            "model": {"hf_config": TINY_BERT},
            "train": {"seq_len": 64},
            "eval": {"output_uri": (folder / "eval.json").as_uri(), "metrics": [scorer]},
        }
    )


def test_a_classifier_is_evaluated_by_accuracy_and_f1_over_its_labels(
    classifier_run, kinds_dataset, tmp_path
):
    from trainer.evaluate import run_evaluate

    # a team's own scorer, beside the built-in figures
    config = _eval_config(classifier_run, kinds_dataset, tmp_path, "examples.team_metrics:worst_label_recall")
    whole = run_evaluate(config)
    report = whole["candidate"]
    assert report["records"] == report["tokens"] == 60
    # the team's metric is scored on the same predictions: the lowest of the labels' recalls,
    # overall and on each slice, and named with the function that gave it
    assert report["worst_label_recall"] == pytest.approx(
        min(v["recall"] for v in report["per_label"].values())
    )
    assert report["user_metrics"] == {"worst_label_recall": "examples.team_metrics:worst_label_recall"}
    assert all(0 <= s["worst_label_recall"] <= 1 for s in report["slices"]["source"].values())
    # each record's prediction is kept beside the report, for a paired comparison of two models
    kept = read_json(tmp_path / "eval.records.json")
    assert (kept["unit"], kept["count"], kept["baseline"]) == ("eval record", 60, None)
    right = np.equal(kept["candidate"]["predicted"], kept["candidate"]["truth"])
    assert right.mean() == pytest.approx(report["accuracy"])
    assert np.mean(kept["candidate"]["loss_sum"]) == pytest.approx(report["eval_loss"])
    assert sorted(report["per_label"]) == LABELS
    assert sum(v["support"] for v in report["per_label"].values()) == 60
    # the figures are the predictions' own: accuracy is the support-weighted recall
    recall = sum(v["recall"] * v["support"] for v in report["per_label"].values()) / 60
    assert report["accuracy"] == pytest.approx(recall)
    assert report["f1_macro"] == pytest.approx(np.mean([v["f1"] for v in report["per_label"].values()]))
    assert report["accuracy"] > 1 / 3  # better than a constant guess at this small a budget
    assert sorted(report["slices"]["source"]) == ["forum", "news", "wiki"]
    assert 0 <= report["calibration_error"] <= 1 and report["auroc"] is None  # three labels: no AUROC
    # the confusion matrix counts every record once, its diagonal the right ones; each slice's
    # accuracy is its records' share of right ones, the slices together the whole
    counts = np.asarray(report["confusion"]["counts"])
    assert report["confusion"]["labels"] == LABELS and counts.sum() == 60
    assert np.trace(counts) / 60 == pytest.approx(report["accuracy"])
    slices = report["slices"]["source"].values()
    assert sum(s["accuracy"] * s["tokens"] for s in slices) / 60 == pytest.approx(report["accuracy"])
    # every figure per slice too: a slice's macro F1 and calibration are its own records'
    assert all(0 <= s["f1_macro"] <= 1 and 0 <= s["calibration_error"] <= 1 for s in slices)


def test_a_classifier_preempted_then_killed_resumes_bitwise_identical(
    classifier_run, kinds_dataset, tmp_path
):
    """SIGTERM inside step 2, then SIGKILL in step 9 after the step-8 commit, then to the end
    (``tests.trainer.helpers.preempted_then_killed``): the same bytes as the uninterrupted run,
    dropout's random draws included."""
    config, _ = run_config(tmp_path, kinds_dataset, "run", model={"hf_config": TINY_BERT})
    records = preempted_then_killed(config, tmp_path / "run", tmp_path, OVERRIDES)
    assert (records[1]["outcome"], records[1]["last_step"], records[1]["steps_lost"]) == ("preempted", 3, 0)
    assert (records[3]["outcome"], records[3]["resumed_from_step"], records[3]["last_step"]) == (
        "completed",
        8,
        STEPS,
    )
    assert (tmp_path / "run" / "export" / "model.safetensors").read_bytes() == (
        classifier_run["run_dir"] / "export" / "model.safetensors"
    ).read_bytes()


def test_a_user_metric_that_raises_fails_the_evaluation_naming_it_and_writes_no_report(
    classifier_run, kinds_dataset, tmp_path
):
    from trainer.evaluate import run_evaluate
    from trainer.evaluate.user import UserMetricError

    config = _eval_config(classifier_run, kinds_dataset, tmp_path, "tests.trainer.evaluate.test_user:raising")
    with pytest.raises(
        UserMetricError, match=r"user metric tests.trainer.evaluate.test_user:raising raised KeyError"
    ):
        run_evaluate(config)
    assert list(tmp_path.iterdir()) == []  # no report, no per-record file: nothing half-written
