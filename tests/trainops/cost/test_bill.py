"""A run's bill as it ends: put into job.json and said in the task log; a bad Variable or a
fault in the estimate never fails the task."""

from tests.task_log import RecordingLog
from tests.trainops.cost.fixtures import FIXTURE_PRICES, one_preemption_job
from trainer.storage import open_storage
from trainops.cost.bill import prices_variable, with_bill


def bill(tmp_path, job, prices=FIXTURE_PRICES):
    log = RecordingLog()
    run_uri = (tmp_path / "run").as_uri()
    return with_bill(job, store=open_storage(run_uri), run_uri=run_uri, prices=prices, log=log), log


def test_the_bill_goes_into_the_record_and_the_task_log(tmp_path, monkeypatch):
    monkeypatch.delenv("AIRFLOW_VAR_TRAINOPS_PRICES", raising=False)
    job, _ = one_preemption_job()
    billed, log = bill(tmp_path, job)
    assert billed["cost"]["cost"] > 0 and "cost" not in job  # a new record; the old one stands
    level, line = log.lines[0]
    assert level == "info" and line.startswith("estimated cost (prices: prices parameter")
    assert "GPU-hours billed" in line and f"python -m trainops cost {(tmp_path / 'run').as_uri()}" in line


def test_a_bad_prices_variable_is_ignored_with_a_warning(tmp_path, monkeypatch):
    monkeypatch.setenv("AIRFLOW_VAR_TRAINOPS_PRICES", '{"p4d.24xlarge": []}')
    assert prices_variable() == '{"p4d.24xlarge": []}'
    billed, log = bill(tmp_path, one_preemption_job()[0])
    assert "cost" in billed
    assert log.lines[0][0] == "warning" and log.lines[0][1].startswith("Variable trainops_prices ignored")


def test_no_variable_reads_as_none(monkeypatch):
    monkeypatch.delenv("AIRFLOW_VAR_TRAINOPS_PRICES", raising=False)
    assert prices_variable() is None


def test_a_fault_in_the_estimate_leaves_the_record_as_it_was_with_a_warning(tmp_path, monkeypatch):
    monkeypatch.delenv("AIRFLOW_VAR_TRAINOPS_PRICES", raising=False)
    job = {**one_preemption_job()[0], "attempts": [{"attempt": 1}]}  # nothing to bill from
    billed, log = bill(tmp_path, job)
    assert billed is job
    assert log.lines[-1][0] == "warning" and log.lines[-1][1].startswith("no cost estimate for file://")
