"""The lineage card: what the upstream results and the run's stored records put into it."""

from __future__ import annotations

import hashlib

import pytest

from trainer.contract import join
from trainer.storage import open_storage
from trainops.registry.card import build_card, validation_summary
from trainops.registry.promotion import PromotionError

CONFIG = (
    b"data_uri: file:///datasets/demo/3f2a\nmodel:\n  preset: tiny\n"
    b"train:\n  seq_len: 64\neval:\n  batch_size: 8\n  max_batches: 4\n"
)


def upstream(root: str, storage, *, config: bytes = CONFIG) -> dict:
    """The results of the stage, train, evaluate and gate tasks, and what they stored."""
    run_uri = join(root, "runs", "retrain", "manual_1", "train")
    storage.put(join(run_uri, "config.yaml"), config)
    validation_uri = join(root, "datasets", "demo", "3f2a", "validation.json")
    storage.put_json(
        validation_uri,
        {
            "success": True,
            "evaluated_expectations": 6,
            "successful_expectations": 5,
            "rows": 500,
            "failed": [
                {"expectation": "expect_column_values_to_not_be_null", "column": "id"},
                {"expectation": "expect_table_row_count_to_be_between"},
            ],
        },
    )
    return {
        "gate": {
            "approved": True,
            "checks": [{"name": "loss cap", "passed": True}],
            "gate_uri": join(run_uri, "eval", "gate.json"),
            "production_version": 2,
            "check_definitions": [{"name": "loss cap", "kind": "threshold"}],
        },
        "training": {
            "run_uri": run_uri,
            "config_uri": join(run_uri, "config.yaml"),
            "export_uri": join(run_uri, "export"),
            "steps": 40,
            "attempts": 2,
            "preemptions": 1,
            "restarts_in_place": 2,
            "steps_lost": 3,
            "steps_skipped": [[11, 15]],
            "final_loss": 2.5,
            "job_uri": join(run_uri, "job.json"),
        },
        "dataset": {
            "dataset_name": "demo",
            "version": "3f2a",
            "uri": join(root, "datasets", "demo", "3f2a"),
            "rows": 500,
            "train_tokens": 9000,
            "eval_tokens": 1000,
            "validation_uri": validation_uri,
        },
        "evaluation": {
            "candidate": {"eval_loss": 2.6, "tokens": 4096},
            "production": {"eval_loss": 2.7, "tokens": 4096},
            "production_version": 2,
            "metrics_uri": join(run_uri, "eval", "metrics.json"),
        },
    }


def test_the_card_records_dataset_run_config_basis_metrics_gate_and_training(file_root):
    storage = open_storage(file_root)
    results = upstream(file_root, storage)
    card = build_card(storage, **results)
    training = results["training"]
    assert card["run_uri"] == training["run_uri"] and card["config_uri"] == training["config_uri"]
    assert card["config_sha256"] == hashlib.sha256(CONFIG).hexdigest()
    assert card["config"]["model"] == {"preset": "tiny"}
    assert card["eval_basis"] == {
        "data_uri": "file:///datasets/demo/3f2a",
        "seq_len": 64,
        "max_batches": 4,
        "batch_size": 8,
    }
    assert card["dataset"]["version"] == "3f2a" and card["dataset"]["quarantined_rows"] is None
    assert card["dataset"]["validation"] == {
        "uri": results["dataset"]["validation_uri"],
        "success": True,
        "evaluated_expectations": 6,
        "successful_expectations": 5,
        "rows": 500,
        "failed": ["expect_column_values_to_not_be_null(id)", "expect_table_row_count_to_be_between"],
    }
    assert card["metrics"] == {
        "candidate": {"eval_loss": 2.6, "tokens": 4096},
        "production": {"eval_loss": 2.7, "tokens": 4096},
        "production_version": 2,
        "metrics_uri": results["evaluation"]["metrics_uri"],
    }
    assert card["gate"] == {
        "approved": True,
        "checks": results["gate"]["checks"],
        "gate_uri": results["gate"]["gate_uri"],
        "production_version": 2,
        "check_definitions": results["gate"]["check_definitions"],
    }
    assert card["training"] == {
        key: training[key]
        for key in (
            "steps",
            "attempts",
            "preemptions",
            "restarts_in_place",
            "steps_lost",
            "steps_skipped",
            "final_loss",
            "job_uri",
        )
    }
    assert card["training"]["restarts_in_place"] == 2  # torchrun's, inside the attempts
    assert card["training"]["steps_skipped"] == [[11, 15]]  # what bad-loss rollbacks skipped
    assert (card["preemptions_survived"], card["steps"]) == (1, 40)


def test_validation_summary_of_no_report_and_of_a_missing_one(file_root):
    storage = open_storage(file_root)
    assert validation_summary(storage, None) is None
    missing = join(file_root, "datasets", "d", "v", "validation.json")
    assert validation_summary(storage, missing) == {"uri": missing, "missing": True}


def test_a_missing_or_broken_trainer_config_is_named(file_root):
    storage = open_storage(file_root)
    results = upstream(file_root, storage, config=b"train: [unclosed\n")
    with pytest.raises(PromotionError, match=r"config\.yaml' is not valid YAML"):
        build_card(storage, **results)
    results["training"]["config_uri"] = join(file_root, "runs", "nowhere", "config.yaml")
    with pytest.raises(
        PromotionError, match=r"nowhere/config\.yaml' does not exist; pass the training result"
    ):
        build_card(storage, **results)


# A run's cost as job.json records it (trainops.cost.accounting.RunCost; attempts abridged).
RUN_COST = {
    "format": "trainops.cost/v1",
    "estimate": True,
    "currency": "USD",
    "attempts": [{"attempt": 1, "spans": [{"phase": "productive", "start": 0.0, "end": 50.0}]}],
    "seconds": {"queued": 30.0, "startup": 60.0, "productive": 120.0, "replayed": 10.0},
    "billed_gpu_hours": 0.5644,
    "productive_gpu_hours": 0.2667,
    "lost_gpu_hours": 0.1689,
    "goodput": 0.4724,
    "recovery_s": [77.5],
    "preemptions": 1,
    "cost": 0.8093,
    "on_demand_cost": 2.3121,
    "savings": 1.5028,
    "notes": [],
}


def test_the_card_records_the_training_cost_from_the_runs_job_json(file_root):
    storage = open_storage(file_root)
    results = upstream(file_root, storage)
    job_uri = results["training"]["job_uri"]
    storage.put_json(job_uri, {"run_uri": results["training"]["run_uri"], "attempts": [], "cost": RUN_COST})
    card = build_card(storage, **results)
    assert card["training_cost"] == {
        "estimate": True,
        "format": "trainops.cost/v1",
        "currency": "USD",
        "cost": 0.8093,
        "on_demand_cost": 2.3121,
        "savings": 1.5028,
        "goodput": 0.4724,
        "billed_gpu_hours": 0.5644,
        "productive_gpu_hours": 0.2667,
        "lost_gpu_hours": 0.1689,
        "preemptions": 1,
        "recovery_s": [77.5],
        "seconds": RUN_COST["seconds"],
        "notes": [],
        "job_uri": job_uri,
    }
    # the rest of the card is as before: its readers find what they read
    assert card["run_uri"] == results["training"]["run_uri"] and card["eval_basis"]["seq_len"] == 64


def test_a_run_without_a_cost_gets_none_and_the_results_copy_stands_in_for_a_missing_record(file_root):
    storage = open_storage(file_root)
    results = upstream(file_root, storage)
    assert build_card(storage, **results)["training_cost"] is None  # no job.json at all
    storage.put_json(results["training"]["job_uri"], {"attempts": []})  # a run from before cost accounting
    assert build_card(storage, **results)["training_cost"] is None
    results["training"]["cost"] = RUN_COST  # the training result carries it (XCom "cost")
    cost = build_card(storage, **results)["training_cost"]
    assert (cost["cost"], cost["goodput"], cost["estimate"]) == (0.8093, 0.4724, True)


def test_a_card_with_a_training_cost_still_reads_as_a_model_card(file_root):
    import json

    from trainops.reports.pages import render_report, report_kind

    storage = open_storage(file_root)
    results = upstream(file_root, storage)
    storage.put_json(results["training"]["job_uri"], {"attempts": [], "cost": RUN_COST})
    card = {**build_card(storage, **results), "format": "trainops.model-card/v1", "model": "m", "version": 3}
    uri = join(file_root, "models", "m", "versions", "3", "card.json")
    assert report_kind(uri, card) == "model_card"
    page = render_report(uri, json.dumps(card).encode())
    assert "Model card: m v3" in page and "training_cost" in page and "0.4724" in page


def test_the_lineage_names_the_parent_version_a_run_started_from(file_root):
    storage = open_storage(file_root)
    parent = join(file_root, "models", "retrain-lm", "versions", "7")
    warm = CONFIG + f"init:\n  from: {parent}/\n".encode()
    card = build_card(storage, **upstream(file_root, storage, config=warm))
    assert card["lineage"] == {"parent": {"name": "retrain-lm", "version": 7, "uri": f"{parent}/"}}
    cold = build_card(storage, **upstream(file_root, storage, config=CONFIG + b"init:\n  from: none\n"))
    assert cold["lineage"] == {"parent": None}
    older = build_card(storage, **upstream(file_root, storage))  # a config from before init.from
    assert older["lineage"] == {"parent": None}


@pytest.mark.parametrize(
    "source,parent",
    [
        ("s3://b/root/models/m/versions/12", {"name": "m", "version": 12}),
        ("file:///r/runs/d/r1/train/export", {"name": None, "version": None}),
        ("s3://b/models/m/versions/latest", {"name": None, "version": None}),
    ],
)
def test_a_parent_that_is_not_a_promoted_version_keeps_its_uri_only(source, parent):
    from trainops.registry.card import parent_of

    assert parent_of({"init": {"from": source}}) == {**parent, "uri": source}
    assert parent_of({"init": "none"}) is None and parent_of({}) is None


@pytest.mark.parametrize(
    "user, run_type, expected_by",
    [
        ("alice", "manual", "alice"),  # triggered from the UI or the API by alice
        (None, "scheduled", "scheduled run"),  # the scheduler made it: the kind says so
        ("", "asset_triggered", "asset_triggered run"),
    ],
)
def test_who_promoted_is_the_runs_triggering_user_or_else_its_trigger_kind(user, run_type, expected_by):
    from types import SimpleNamespace

    from airflow.sdk.api.datamodels._generated import DagRunType

    from trainops.registry.card import by_label, trigger_of

    # what the task context's DagRun carries: Airflow's DagRunType enum
    dag_run = SimpleNamespace(triggering_user_name=user, run_type=DagRunType(run_type), run_id="r1")
    trigger = trigger_of(dag_run)
    assert trigger == {"user": user or None, "trigger": run_type, "run_id": "r1"}
    assert by_label(trigger) == expected_by
    assert trigger_of(None) == {"user": None, "trigger": None, "run_id": None}
    assert by_label(trigger_of(None)) is None
