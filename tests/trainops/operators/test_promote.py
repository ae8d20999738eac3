"""PromoteModelOperator with plain dicts on real storage."""

from __future__ import annotations

import hashlib
import json

import pytest
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

import trainops
from trainer.contract import RunLayout, join, model_version_prefix, production_pointer
from trainer.storage import open_storage
from trainops.operators.gate import EvaluationGateOperator
from trainops.operators.promote import PromoteModelOperator
from trainops.registry.promotion import read_production

CONFIG = (
    b"data_uri: file:///datasets/demo/2026-01-01\nmodel:\n  preset: tiny\n"
    b"train:\n  seq_len: 64\n  max_steps: 40\neval:\n  batch_size: 8\n  max_batches: 0\n"
)
VALIDATION = {
    "success": True,
    "evaluated_expectations": 6,
    "successful_expectations": 6,
    "failed": [],
    "results": [],
    "rows": 500,
}


class FakeTI:
    """What an operator sees of its task instance: pushes are recorded."""

    def __init__(self):
        self.pushed = {}

    def xcom_push(self, key, value):
        self.pushed[key] = value


def finished_run(root: str, name: str, config: bytes = CONFIG) -> tuple[dict, dict]:
    """A training result and a dataset result, with the export and config in storage."""
    storage = open_storage(root)
    run_uri = join(root, "runs", "retrain", name, "train")
    storage.put(join(run_uri, "export", "model.safetensors"), f"weights {name}".encode())
    storage.put(join(run_uri, "export", "config.json"), b'{"dim": 64}')
    storage.put(join(run_uri, "config.yaml"), config)
    storage.put_json(join(root, "datasets", "demo", "validation.json"), VALIDATION)
    training = {
        "run_uri": run_uri,
        "export_uri": join(run_uri, "export"),
        "config_uri": join(run_uri, "config.yaml"),
        "steps": 40,
        "attempts": 2,
        "preemptions": 1,
        "steps_lost": 3,
        "final_loss": 2.9,
    }
    dataset = {
        "dataset_name": "demo",
        "version": "2026-01-01",
        "uri": join(root, "datasets", "demo"),
        "manifest_uri": join(root, "datasets", "demo", "manifest.json"),
        "rows": 500,
        "train_tokens": 90_000,
        "eval_tokens": 10_000,
        "reused": False,
        "validation_uri": join(root, "datasets", "demo", "validation.json"),
    }
    return training, dataset


def dataset_validation_uri(root: str) -> str:
    return join(root, "datasets", "demo", "validation.json")


def evaluation_of(
    training: dict, eval_loss: float, production: float | None, production_version: int | None
) -> dict:
    def metrics(loss):
        return {"eval_loss": loss, "perplexity": 2.718**loss, "tokens": 10_000, "slices": {}}

    return {
        "metrics_uri": join(training["run_uri"], "eval", "metrics.json"),
        "run_uri": training["run_uri"],
        "model_name": "demo-lm",
        "candidate": metrics(eval_loss),
        "production": None if production is None else metrics(production),
        "production_version": production_version,
    }


def gate_of(
    root: str,
    training: dict,
    eval_loss: float,
    production: float | None = None,
    production_version: int | None = None,
) -> tuple[dict, dict]:
    evaluation = evaluation_of(training, eval_loss, production, production_version)
    gate = EvaluationGateOperator(
        task_id="gate", evaluation=evaluation, storage_root=root, aws_conn_id=None
    ).execute({})
    return gate, evaluation


def promote_op(
    root: str,
    gate: dict,
    training: dict,
    dataset: dict,
    evaluation: dict,
    model_name: str = "demo-lm",
    **kwargs,
) -> PromoteModelOperator:
    return PromoteModelOperator(
        task_id="promote",
        model_name=model_name,
        gate=gate,
        training=training,
        dataset=dataset,
        evaluation=evaluation,
        storage_root=root,
        aws_conn_id=None,
        **kwargs,
    )


def gate_then_promote(
    root: str,
    name: str,
    eval_loss: float,
    production: float | None = None,
    production_version: int | None = None,
    model_name: str = "demo-lm",
    context: dict | None = None,
    **kwargs,
):
    training, dataset = finished_run(root, name)
    gate, evaluation = gate_of(root, training, eval_loss, production, production_version)
    op = promote_op(root, gate, training, dataset, evaluation, model_name, **kwargs)
    return op.execute({} if context is None else context), training


@pytest.mark.parametrize("root_fixture", ["file_root", "s3_root"])
def test_approved_model_becomes_production_with_a_lineage_card(request, root_fixture):
    root = request.getfixturevalue(root_fixture)
    storage = open_storage(root)
    ti = FakeTI()
    first, _run1 = gate_then_promote(root, "run-1", 3.0, context={"ti": ti})
    assert json.loads(json.dumps(first, allow_nan=False)) == first
    v1 = model_version_prefix(root, "demo-lm", 1)
    assert first == {
        "model_name": "demo-lm",
        "version": 1,
        "version_uri": v1,
        "card_uri": join(v1, "card.json"),
        "production_uri": production_pointer(root, "demo-lm"),
        "previous_version": None,
        "production_version": 1,
        "regated_against": [],
        "pruned": [],
    }
    assert ti.pushed == {"trainops_model_card": join(v1, "card.json")}

    second, run2 = gate_then_promote(root, "run-2", 2.9, production=3.0, production_version=1)
    assert (second["version"], second["previous_version"]) == (2, 1)
    assert storage.get(join(second["version_uri"], "model.safetensors")) == b"weights run-2"

    card = storage.get_json(second["card_uri"])
    # Every piece of lineage the issue names: dataset version and its GX summary ...
    assert card["dataset"]["dataset_name"] == "demo"
    assert card["dataset"]["version"] == "2026-01-01"
    assert card["dataset"]["validation"] == {
        "uri": dataset_validation_uri(root),
        "success": True,
        "evaluated_expectations": 6,
        "successful_expectations": 6,
        "rows": 500,
        "failed": [],
    }
    # ... the run, the trainer config and its hash ...
    assert card["run_uri"] == run2["run_uri"]
    assert card["config_uri"] == run2["config_uri"]
    assert card["config_sha256"] == hashlib.sha256(CONFIG).hexdigest()
    assert card["config"]["train"] == {"seq_len": 64, "max_steps": 40}
    assert card["eval_basis"] == {
        "data_uri": "file:///datasets/demo/2026-01-01",
        "seq_len": 64,
        "max_batches": 0,
        "batch_size": None,
    }
    # ... the metrics and the gate decision ...
    assert card["metrics"]["candidate"]["eval_loss"] == 2.9
    assert card["metrics"]["production"]["eval_loss"] == 3.0
    assert card["gate"]["approved"] is True and card["gate"]["production_version"] == 1
    assert [c["kind"] for c in card["gate"]["check_definitions"]] == ["threshold", "no_regression"]
    assert [c["passed"] for c in card["gate"]["checks"]] == [True, True]
    # ... the preemptions survived and the trainops version.
    assert card["preemptions_survived"] == 1 and card["steps"] == 40
    assert card["training"]["steps_lost"] == 3
    assert card["trainops_version"] == trainops.__version__

    pointer = read_production(storage, root, "demo-lm")
    assert pointer["version"] == 2
    assert [h["version"] for h in pointer["history"]] == [1, 2]


def test_a_promotion_records_who_triggered_the_run_on_the_card_and_in_the_history(file_root, capsys):
    from types import SimpleNamespace

    manual = SimpleNamespace(triggering_user_name="alice", run_type="manual", run_id="manual__1")
    first, _ = gate_then_promote(file_root, "run-1", 3.0, context={"dag_run": manual})
    scheduled = SimpleNamespace(triggering_user_name=None, run_type="scheduled", run_id="scheduled__2")
    second, _ = gate_then_promote(
        file_root, "run-2", 2.9, production=3.0, production_version=1, context={"dag_run": scheduled}
    )
    storage = open_storage(file_root)
    assert storage.get_json(first["card_uri"])["promoted_by"] == {
        "user": "alice",
        "trigger": "manual",
        "run_id": "manual__1",
    }
    assert storage.get_json(second["card_uri"])["promoted_by"]["user"] is None
    history = read_production(storage, file_root, "demo-lm")["history"]
    assert [(h["version"], h.get("by")) for h in history] == [(1, "alice"), (2, "scheduled run")]
    out = capsys.readouterr().out
    assert "promoted demo-lm v1 (was none) for alice" in out
    assert "promoted demo-lm v2 (was v1) for scheduled run" in out


def test_a_candidate_with_productions_weights_is_skipped_as_identical_not_published_again(file_root):
    storage = open_storage(file_root)
    first, run1 = gate_then_promote(file_root, "run-1", 3.0)
    training, dataset = finished_run(file_root, "run-2")
    weights = storage.get(join(run1["export_uri"], "model.safetensors"))
    storage.put(join(training["export_uri"], "model.safetensors"), weights)  # retrained the same
    gate, evaluation = gate_of(file_root, training, 3.0, production=3.0, production_version=1)
    pointer_before = storage.get(production_pointer(file_root, "demo-lm"))

    with pytest.raises(AirflowSkipException) as skipped:
        promote_op(file_root, gate, training, dataset, evaluation).execute({})
    message = str(skipped.value)
    assert message.startswith("not promoting demo-lm: identical to production v1 (same weights sha256 ")
    assert message.endswith("); nothing new to publish")
    assert "weights_sha256" not in storage.get_json(first["card_uri"])  # v1 had nothing to compare with
    assert storage.get(production_pointer(file_root, "demo-lm")) == pointer_before
    assert not storage.list(model_version_prefix(file_root, "demo-lm", 2))  # no version claimed
    # what became of the candidate is recorded for `python -m trainops runs` and the home page
    record = storage.get_json(RunLayout(training["run_uri"]).promotion)
    assert (record["outcome"], record["version"], record["model_name"]) == ("identical", 1, "demo-lm")
    assert storage.get_json(RunLayout(run1["run_uri"]).promotion)["outcome"] == "promoted"

    # A different model of the same size is promoted, and its card keeps the digest computed.
    third, _ = gate_then_promote(file_root, "run-3", 2.9, production=3.0, production_version=1)
    assert third["version"] == 2
    assert len(storage.get_json(third["card_uri"])["weights_sha256"]) == 64


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
    assert message.endswith("eval/gate.json")  # where the whole decision is
    assert read_production(open_storage(file_root), file_root, "demo-lm")["version"] == 1


def test_on_rejection_fail_fails_the_task_with_the_same_message(file_root):
    """For teams whose alerts watch failed tasks: a rejection fails promote (no retry)."""
    gate_then_promote(file_root, "run-1", 3.0)
    training, dataset = finished_run(file_root, "run-2")
    gate, evaluation = gate_of(file_root, training, 3.2, 3.0, 1)
    op = promote_op(file_root, gate, training, dataset, evaluation, on_rejection="fail")
    with pytest.raises(AirflowFailException) as err:
        op.execute({})
    assert str(err.value).startswith("not promoting demo-lm: the gate rejected it: ")
    assert read_production(open_storage(file_root), file_root, "demo-lm")["version"] == 1
    with pytest.raises(ValueError, match="on_rejection must be one of"):
        promote_op(file_root, gate, training, dataset, evaluation, on_rejection="alert")


def gated_then_overtaken(root: str, my_loss: float, rival_loss: float, rival_config: bytes = CONFIG):
    """v1 is production; this run is gated against it; then a rival run promotes v2."""
    gate_then_promote(root, "run-1", 3.0)
    training, dataset = finished_run(root, "run-2")
    gate, evaluation = gate_of(root, training, my_loss, 3.0, 1)
    rival, rival_dataset = finished_run(root, "run-3", config=rival_config)
    rival_gate, rival_evaluation = gate_of(root, rival, rival_loss, 3.0, 1)
    promote_op(root, rival_gate, rival, rival_dataset, rival_evaluation).execute({})
    return promote_op(root, gate, training, dataset, evaluation)


def test_production_moved_after_gating_regates_and_promotes_a_better_model(file_root):
    result = gated_then_overtaken(file_root, 2.5, 2.8).execute({})
    assert (result["version"], result["previous_version"], result["regated_against"]) == (3, 2, [2])
    pointer = read_production(open_storage(file_root), file_root, "demo-lm")
    assert [h["version"] for h in pointer["history"]] == [1, 2, 3]


def test_production_moved_after_gating_to_a_better_model_skips_with_the_reason(
    file_root, capsys, monkeypatch
):
    from trainops.operators import notes

    written = []
    monkeypatch.setattr(notes, "write_notes", lambda context, **kw: written.append(kw["run_note"]))
    op = gated_then_overtaken(file_root, 2.9, 2.5)
    with pytest.raises(AirflowSkipException) as err:
        op.execute({})
    # the run's note says it too; the notes before it are the three gates' approvals
    *approvals, note = written
    assert len(approvals) == 3 and all(
        a.startswith("APPROVED: demo-lm passed 2 of 2 gate checks") for a in approvals
    )
    assert note.startswith("REJECTED on re-gate: production of 'demo-lm' moved from v1 to v2")
    assert note.endswith("; promote skipped, production unchanged.")
    assert str(err.value).startswith(
        "not promoting demo-lm: production of 'demo-lm' moved from v1 to v2 while this run was "
        "gated; re-gated against v2, the candidate fails: eval_loss no regression (tolerance 0) "
        "(observed 2.9, expected <= 2.5;"
    )
    assert "re-gating against it" in capsys.readouterr().out  # the re-gate's table is logged
    assert read_production(open_storage(file_root), file_root, "demo-lm")["version"] == 2


def test_production_moved_to_a_model_evaluated_otherwise_fails_without_retry(file_root):
    other = CONFIG.replace(b"seq_len: 64", b"seq_len: 128")
    op = gated_then_overtaken(file_root, 2.5, 2.8, rival_config=other)
    with pytest.raises(
        AirflowFailException,
        match=r"moved from v1 to v2 while this run was gated, and v2 was evaluated "
        r"with seq_len 128, this candidate with 64.*evaluated against v2: "
        r"clear this DAG run's evaluate task",
    ):
        op.execute({})
    assert read_production(open_storage(file_root), file_root, "demo-lm")["version"] == 2


def test_retention_prunes_after_promotion_and_after_rejection(file_root):
    storage = open_storage(file_root)

    def with_checkpoints(training):
        layout = RunLayout(training["run_uri"])
        for step in (20, 40):
            storage.put(join(layout.checkpoint(step), "shard.distcp"), b"x")
            storage.put(layout.committed_marker(step), b"{}")
        return layout

    training, dataset = finished_run(file_root, "run-1")
    first = with_checkpoints(training)
    gate, evaluation = gate_of(file_root, training, 3.0)
    result = promote_op(
        file_root, gate, training, dataset, evaluation, retention={"keep_last_runs": 0}
    ).execute({})
    assert result["pruned"] == [first.checkpoint(20)]  # the promoted run keeps its final step
    assert storage.exists(first.committed_marker(40))

    training, dataset = finished_run(file_root, "run-2")
    second = with_checkpoints(training)
    gate, evaluation = gate_of(file_root, training, 3.5, 3.0, 1)
    with pytest.raises(AirflowSkipException):
        promote_op(file_root, gate, training, dataset, evaluation, retention={"keep_last_runs": 0}).execute(
            {}
        )
    assert storage.list(second.checkpoints) == []  # a rejected run keeps no checkpoint
    assert storage.exists(first.committed_marker(40))  # production's run is untouched
    assert storage.exists(join(second.export, "model.safetensors"))


def test_a_bad_retention_policy_fails_at_parse():
    with pytest.raises(ValueError, match=r"retention has unknown key 'keep'"):
        PromoteModelOperator(
            task_id="p",
            model_name="m",
            gate={},
            training={},
            dataset={},
            evaluation={},
            retention={"keep": 1},
        )


def test_model_name_must_match_the_gated_model(file_root):
    with pytest.raises(ValueError, match=r"'demo-lm'.*'other-lm'"):
        gate_then_promote(file_root, "run-1", 3.0, model_name="other-lm")


def test_missing_upstream_key_is_named(file_root):
    training, dataset = finished_run(file_root, "run-1")
    del training["export_uri"]
    op = PromoteModelOperator(
        task_id="promote",
        model_name="demo-lm",
        gate={"approved": True, "checks": [], "production_version": None},
        training=training,
        dataset=dataset,
        evaluation={"candidate": {}},
        storage_root=file_root,
    )
    with pytest.raises(ValueError, match=r"training result lacks 'export_uri'"):
        op.execute({})


def test_templated_fields_cover_every_upstream_result():
    assert set(PromoteModelOperator.template_fields) == {
        "model_name",
        "gate",
        "training",
        "dataset",
        "evaluation",
    }


def test_a_model_name_that_is_not_one_fails_at_parse_or_once_rendered_before_anything_is_written(file_root):
    with pytest.raises(
        ValueError, match=r"model_name 'xxxx.*is 300 characters long; at most 128 are allowed"
    ):
        PromoteModelOperator(
            task_id="p", model_name="x" * 300, gate={}, training={}, dataset={}, evaluation={}
        )
    training, dataset = finished_run(file_root, "run-1")
    gate, evaluation = gate_of(file_root, training, 3.0)
    op = promote_op(file_root, gate, training, dataset, evaluation, model_name="{{ params.model }}")
    op.model_name = "   "  # as rendered from an empty param
    with pytest.raises(AirflowFailException, match=r"model_name '   ' is empty"):
        op.execute({})
    assert open_storage(file_root).list(join(file_root, "models")) == []


def test_promoting_into_another_models_registry_fails_without_retry_naming_both(file_root):
    gate_then_promote(file_root, "run-1", 3.0, model_name="demo-lm")
    uri = production_pointer(file_root, "demo-lm")
    storage = open_storage(file_root)
    storage.put_json(uri, {**storage.get_json(uri), "model": "demo lm"})  # trainops before #25
    before = storage.get(uri)
    with pytest.raises(AirflowFailException, match=rf"^{uri} records model 'demo lm', not 'demo-lm': "):
        gate_then_promote(file_root, "run-2", 2.0, production=3.0, production_version=1, model_name="demo-lm")
    assert storage.get(uri) == before
    assert storage.list(model_version_prefix(file_root, "demo-lm", 2)) == []


def test_a_promotion_emits_the_models_asset_event_with_the_new_version(file_root):
    from tests.trainops.operators.test_production_asset import Events

    events = Events()
    result, _ = gate_then_promote(file_root, "run-1", 3.0, context={"outlet_events": events})
    ((_, uri, extra),) = events.added
    assert uri == "trainops://models/demo-lm"
    assert (extra["action"], extra["version"], extra["uri"], extra["previous_version"]) == (
        "promote",
        1,
        result["version_uri"],
        None,
    )
