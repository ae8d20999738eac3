"""RollbackModelOperator on real storage."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from airflow.sdk.exceptions import AirflowFailException

from trainer.contract import join
from trainer.storage import open_storage
from trainops.operators import RollbackModelOperator
from trainops.registry.promotion import promote, read_production


def promote_runs(root: str, count: int) -> None:
    storage = open_storage(root)
    for n in range(1, count + 1):
        run_uri = join(root, "runs", "retrain", f"run-{n}", "train")
        storage.put(join(run_uri, "export", "model.safetensors"), f"weights {n}".encode())
        promote(
            storage,
            root,
            "demo-lm",
            export_uri=join(run_uri, "export"),
            card={"run_uri": run_uri},
            expected_production_version=(n - 1) or None,
        )


def context(user: str | None = "alice") -> dict:
    ti = SimpleNamespace(dag_id="ops", run_id="manual__1", task_id="rollback")
    return {"ti": ti, "dag_run": SimpleNamespace(triggering_user_name=user)}


def test_rollback_operator_records_the_triggering_user_and_the_task(file_root, capsys):
    promote_runs(file_root, 3)
    op = RollbackModelOperator(
        task_id="rollback",
        model_name="demo-lm",
        version="2",
        reason="v3 regressed",
        storage_root=file_root,
        aws_conn_id=None,
    )
    result = op.execute(context())
    assert json.loads(json.dumps(result)) == result
    assert (result["changed"], result["version"], result["previous_version"]) == (True, 2, 3)
    entry = read_production(open_storage(file_root), file_root, "demo-lm")["history"][-1]
    assert (entry["action"], entry["by"], entry["reason"], entry["via"]) == (
        "rollback",
        "alice",
        "v3 regressed",
        "ops/manual__1/rollback",
    )
    # Run again (a retry): nothing changes, and the task says its own earlier try did it.
    capsys.readouterr()
    again = op.execute(context())
    assert (again["changed"], again["since"]) == (False, entry)
    assert len(read_production(open_storage(file_root), file_root, "demo-lm")["history"]) == 4
    assert (
        f"demo-lm v2 already is production (since {entry['at']}, rollback from v3 by alice, this "
        "task's own earlier try); nothing changed"
    ) in capsys.readouterr().out


def test_by_defaults_to_airflow_without_a_triggering_user(file_root):
    promote_runs(file_root, 2)
    RollbackModelOperator(
        task_id="rollback",
        model_name="demo-lm",
        version=1,
        reason="r",
        storage_root=file_root,
        aws_conn_id=None,
    ).execute(context(None))
    assert read_production(open_storage(file_root), file_root, "demo-lm")["history"][-1]["by"] == "airflow"


@pytest.mark.parametrize(
    "version, words",
    [
        ("two", ["positive integer", "'two'"]),
        (9, ["no version 9"]),
    ],
)
def test_a_bad_version_fails_without_retry(file_root, version, words):
    promote_runs(file_root, 2)
    op = RollbackModelOperator(
        task_id="rollback",
        model_name="demo-lm",
        version=version,
        reason="r",
        storage_root=file_root,
        aws_conn_id=None,
    )
    with pytest.raises(AirflowFailException) as err:
        op.execute(context())
    for word in words:
        assert word in str(err.value)
    assert read_production(open_storage(file_root), file_root, "demo-lm")["version"] == 2


def test_a_reason_is_required_at_parse():
    with pytest.raises(ValueError, match="non-empty reason"):
        RollbackModelOperator(task_id="rollback", model_name="demo-lm", version=1, reason="")


def test_templated_fields():
    assert set(RollbackModelOperator.template_fields) == {"model_name", "version", "reason", "by"}


def test_a_model_name_that_is_not_one_fails_at_parse_or_once_rendered_before_the_pointer_is_read(file_root):
    with pytest.raises(
        ValueError, match=r"model_name 'xxxx.*is 300 characters long; at most 128 are allowed"
    ):
        RollbackModelOperator(task_id="rollback", model_name="x" * 300, version=1, reason="r")
    op = RollbackModelOperator(
        task_id="rollback", model_name="{{ params.model }}", version=1, reason="r", storage_root=file_root
    )
    op.model_name = "demo\u202elm"  # as rendered: a bidi override makes it show as another name
    with pytest.raises(AirflowFailException, match=r"U\+202E at position 4"):
        op.execute(context())


def test_a_rollback_that_moves_production_emits_the_models_asset_event_and_a_no_op_none(file_root):
    from tests.trainops.operators.test_production_asset import Events
    from trainer.contract import model_version_prefix
    from trainops.operators.production_asset import PRODUCTION_ALIAS

    promote_runs(file_root, 2)
    op = RollbackModelOperator(
        task_id="rollback",
        model_name="demo-lm",
        version=1,
        reason="v2 regressed",
        storage_root=file_root,
        aws_conn_id=None,
    )
    assert [o.name for o in op.outlets] == [PRODUCTION_ALIAS]
    events = Events()
    op.execute({**context(), "outlet_events": events})
    ((alias, uri, extra),) = events.added
    assert (alias, uri) == (PRODUCTION_ALIAS, "trainops://models/demo-lm")
    assert extra == {
        "action": "rollback",
        "model": "demo-lm",
        "version": 1,
        "uri": model_version_prefix(file_root, "demo-lm", 1),
        "previous_version": 2,
        "by": "alice",
    }
    op.execute({**context(), "outlet_events": events})  # v1 already is production: no event
    assert len(events.added) == 1
