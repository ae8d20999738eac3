"""PromoteModelOperator with plain dicts on real storage."""

from __future__ import annotations

import hashlib
import json

import pytest
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from trainer.contract import join, model_version_prefix, production_pointer
from trainer.storage import open_storage
from trainops.operators.gate import EvaluationGateOperator
from trainops.operators.promote import PromoteModelOperator
from trainops.promotion import read_production

CONFIG = b"model:\n  preset: tiny\nsteps: 40\n"


def finished_run(root: str, name: str) -> tuple[dict, dict]:
    """A training result and a dataset result, with the export and config in storage."""
    storage = open_storage(root)
    run_uri = join(root, "runs", "retrain", name, "train")
    storage.put(join(run_uri, "export", "model.safetensors"), f"weights {name}".encode())
    storage.put(join(run_uri, "export", "config.json"), b'{"dim": 64}')
    storage.put(join(run_uri, "config.yaml"), CONFIG)
    training = {"run_uri": run_uri, "export_uri": join(run_uri, "export"),
                "config_uri": join(run_uri, "config.yaml"), "steps": 40, "attempts": 2,
                "preemptions": 1, "steps_lost": 3, "final_loss": 2.9}
    dataset = {"dataset_name": "demo", "version": "2026-01-01",
               "uri": join(root, "datasets", "demo"),
               "manifest_uri": join(root, "datasets", "demo", "manifest.json"), "rows": 500,
               "train_tokens": 90_000, "eval_tokens": 10_000, "reused": False}
    return training, dataset


def evaluation_of(training: dict, eval_loss: float, production: float | None,
                  production_version: int | None) -> dict:
    def metrics(loss):
        return {"eval_loss": loss, "perplexity": 2.718 ** loss, "tokens": 10_000, "slices": {}}

    return {"metrics_uri": join(training["run_uri"], "eval", "metrics.json"),
            "run_uri": training["run_uri"], "model_name": "demo-lm",
            "candidate": metrics(eval_loss),
            "production": None if production is None else metrics(production),
            "production_version": production_version}


def gate_then_promote(root: str, name: str, eval_loss: float, production: float | None = None,
                      production_version: int | None = None, model_name: str = "demo-lm"):
    training, dataset = finished_run(root, name)
    evaluation = evaluation_of(training, eval_loss, production, production_version)
    gate = EvaluationGateOperator(task_id="gate", evaluation=evaluation, storage_root=root,
                                  aws_conn_id=None).execute({})
    op = PromoteModelOperator(task_id="promote", model_name=model_name, gate=gate,
                              training=training, dataset=dataset, evaluation=evaluation,
                              storage_root=root, aws_conn_id=None)
    return op.execute({}), training


@pytest.mark.parametrize("root_fixture", ["file_root", "s3_root"])
def test_approved_model_becomes_production_with_a_lineage_card(request, root_fixture):
    root = request.getfixturevalue(root_fixture)
    storage = open_storage(root)
    first, run1 = gate_then_promote(root, "run-1", 3.0)
    assert json.loads(json.dumps(first, allow_nan=False)) == first
    assert first == {"model_name": "demo-lm", "version": 1,
                     "version_uri": model_version_prefix(root, "demo-lm", 1),
                     "production_uri": production_pointer(root, "demo-lm"),
                     "previous_version": None}

    second, run2 = gate_then_promote(root, "run-2", 2.9, production=3.0, production_version=1)
    assert (second["version"], second["previous_version"]) == (2, 1)
    assert storage.get(join(second["version_uri"], "model.safetensors")) == b"weights run-2"

    card = storage.get_json(join(second["version_uri"], "card.json"))
    assert card["dataset"]["dataset_name"] == "demo"
    assert card["dataset"]["version"] == "2026-01-01"
    assert card["run_uri"] == run2["run_uri"]
    assert card["config_uri"] == run2["config_uri"]
    assert card["config_sha256"] == hashlib.sha256(CONFIG).hexdigest()
    assert card["metrics"]["candidate"]["eval_loss"] == 2.9
    assert card["metrics"]["production"]["eval_loss"] == 3.0
    assert card["gate"]["approved"] is True and card["gate"]["production_version"] == 1
    assert card["preemptions_survived"] == 1 and card["steps"] == 40
    assert card["training"]["steps_lost"] == 3

    pointer = read_production(storage, root, "demo-lm")
    assert pointer["version"] == 2
    assert [h["version"] for h in pointer["history"]] == [1, 2]


def test_promotion_logs_the_version_change(file_root, capsys):
    # Airflow 3's task logger (structlog) prints outside the task runner; caplog sees nothing.
    gate_then_promote(file_root, "run-1", 3.0)
    assert "promoted demo-lm v1 (was none)" in capsys.readouterr().out
    gate_then_promote(file_root, "run-2", 2.9, production=3.0, production_version=1)
    out = capsys.readouterr().out
    assert "promoted demo-lm v2 (was v1)" in out
    assert "gate APPROVED: 2/2 checks passed, against production v1" in out


def test_rejected_gate_skips_and_names_the_failed_check(file_root):
    gate_then_promote(file_root, "run-1", 3.0)
    with pytest.raises(AirflowSkipException) as err:
        gate_then_promote(file_root, "run-2", 3.2, production=3.0, production_version=1)
    message = str(err.value)
    assert "not promoting demo-lm" in message
    assert "eval_loss no regression (tolerance 0)" in message
    assert "observed 3.2" in message and "expected <= 3" in message
    assert "eval_loss <= 10" not in message  # passed checks are not blamed
    assert read_production(open_storage(file_root), file_root, "demo-lm")["version"] == 1


def test_production_moved_after_gating_fails_without_retry(file_root):
    gate_then_promote(file_root, "run-1", 3.0)
    training, dataset = finished_run(file_root, "run-2")
    evaluation = evaluation_of(training, 2.5, 3.0, 1)
    gate = EvaluationGateOperator(task_id="gate", evaluation=evaluation, storage_root=file_root,
                                  aws_conn_id=None).execute({})
    # Another DAG run promotes while this one sits between gate and promote.
    gate_then_promote(file_root, "run-3", 2.8, production=3.0, production_version=1)
    op = PromoteModelOperator(task_id="promote", model_name="demo-lm", gate=gate,
                              training=training, dataset=dataset, evaluation=evaluation,
                              storage_root=file_root, aws_conn_id=None)
    with pytest.raises(AirflowFailException,
                       match="moved from v1 to v2.*re-run to evaluate against v2"):
        op.execute({})
    assert read_production(open_storage(file_root), file_root, "demo-lm")["version"] == 2


def test_model_name_must_match_the_gated_model(file_root):
    with pytest.raises(ValueError, match=r"'demo-lm'.*'other-lm'"):
        gate_then_promote(file_root, "run-1", 3.0, model_name="other-lm")


def test_missing_upstream_key_is_named(file_root):
    training, dataset = finished_run(file_root, "run-1")
    del training["export_uri"]
    op = PromoteModelOperator(task_id="promote", model_name="demo-lm",
                              gate={"approved": True, "checks": [], "production_version": None},
                              training=training, dataset=dataset,
                              evaluation={"candidate": {}}, storage_root=file_root)
    with pytest.raises(ValueError, match=r"training result lacks 'export_uri'"):
        op.execute({})


def test_templated_fields_cover_every_upstream_result():
    assert set(PromoteModelOperator.template_fields) == {
        "model_name", "gate", "training", "dataset", "evaluation"}
