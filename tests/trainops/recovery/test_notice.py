"""The notice budget: a grace period shorter than the last emergency save is said, with numbers."""

from trainops.cluster.spec import shutdown_timeout
from trainops.recovery.notice import grace_for, grace_warning, last_emergency_save, needed_seconds


def entry(attempt, save_s=None, outcome="preempted"):
    record = {"outcome": outcome, **({"emergency_save_s": save_s} if save_s is not None else {})}
    return {"attempt": attempt, "record": record}


def test_a_save_longer_than_what_the_grace_leaves_is_warned_with_the_numbers_and_the_fix():
    warning = grace_warning(60, [entry(1, 58.2)])
    assert warning is not None
    assert "attempt 1 took 58.2 s" in warning
    assert "termination_grace_seconds=60 leaves it 50 s" in warning  # torchrun kills at 50 s
    assert "needs 73 s" in warning  # 58.2 + 25 %, rounded up
    assert f"at least {grace_for(73)}" in warning and shutdown_timeout(grace_for(73)) >= 73
    assert "GKE Spot gives pods 15 s" in warning and "docs/kubernetes.md" in warning


def test_a_save_that_fits_with_its_margin_says_nothing():
    assert grace_warning(60, [entry(1, 38.0)]) is None  # 38 + 10 = 48 <= 50
    assert grace_warning(60, [entry(1, 41.0)]) is not None  # 41 + 10 = 51 > 50


def test_the_newest_measured_save_counts_and_attempts_without_one_are_skipped():
    attempts = [entry(1, 70.0), entry(2, 20.0), entry(3, None, "completed"), {"attempt": 4, "record": None}]
    assert last_emergency_save(attempts) == (2, 20.0)
    assert grace_warning(60, attempts) is None
    assert grace_warning(60, []) is None  # records from before the measurement: no figure


def test_the_margin_is_a_quarter_and_at_least_ten_seconds():
    assert needed_seconds(8.0) == 18
    assert needed_seconds(100.0) == 125
    assert grace_for(18) == 23 and shutdown_timeout(23) == 18 and shutdown_timeout(22) == 17


def test_the_operator_warns_after_a_preemption_whose_save_outgrew_the_grace(file_root, monkeypatch, capsys):
    import pytest
    from airflow.sdk.exceptions import TaskDeferred

    from tests.trainops.cluster.fake_backend import use_fake_cluster
    from tests.trainops.operators.test_train import finished, operator, write_record

    use_fake_cluster(monkeypatch)
    context = {
        "ti": type(
            "TI",
            (),
            {
                "dag_id": "retrain",
                "run_id": "manual__2026-01-01T00:00:00+00:00",
                "task_id": "train",
                "map_index": -1,
            },
        )()
    }
    op = operator(file_root, termination_grace_seconds=30)
    with pytest.raises(TaskDeferred):
        op.execute(context)
    write_record(file_root, 1, "preempted", signal="SIGTERM", emergency_save_s=41.5)
    spot = {"node": 1, "reason": "SpotInterruption", "message": "spot interruption notice"}
    with pytest.raises(TaskDeferred):  # relaunching: the warning comes before the next attempt
        op.execute_complete(context, finished(disruptions=[spot]))
    out = capsys.readouterr().out
    assert "the emergency checkpoint of attempt 1 took 41.5 s" in out
    assert "termination_grace_seconds=30 leaves it 23 s" in out
