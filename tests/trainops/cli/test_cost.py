"""``python -m trainops cost RUN``: one run's bill as a person reads it; RUN as a URI, a
folder, ``latest`` or ``<dag_id>/<run_id>``; a missing credential in one line."""

import json
import os
import subprocess
import sys

import pytest

from tests.trainops.cost.fixtures import FIXTURE_PRICES, one_preemption_job, one_restart_job, one_rollback_job
from trainer.contract import RunLayout, metrics_part_name
from trainer.storage import open_storage
from trainops.cli.cost import run_cost
from trainops.cli.main import main
from trainops.cost.accounting import account
from trainops.cost.causes import CAUSES


@pytest.fixture
def run(tmp_path):
    """The fixture's run in file:// storage: its job.json and metrics parts, no stored cost."""
    job, metrics = one_preemption_job()
    layout = RunLayout((tmp_path / "runs" / "nightly" / "r1" / "train").as_uri())
    store = open_storage(layout.run_uri)
    store.put_json(layout.job, {**job, "run_uri": layout.run_uri})
    for attempt in (1, 2):
        body = "".join(json.dumps(r) + "\n" for r in metrics if r["attempt"] == attempt)
        store.put(f"{layout.metrics_parts}/{metrics_part_name(attempt, 1)}", body.encode())
    return layout, store


def test_an_older_run_is_priced_now_from_its_job_json_and_metrics(run, capsys):
    layout, _ = run
    assert main(["cost", layout.run_uri]) == 0
    out = capsys.readouterr().out
    assert out.startswith(
        f"Estimated cost of {layout.run_uri}\n(every figure is an estimate, in USD; prices: default table)"
    )
    lines = {line.split("  ")[0]: line.split() for line in out.splitlines()}
    assert lines["replayed (steps lost)"][-4:] == [
        "10.0",
        "0.0",
        "10.0",
        "0.0222",
    ]  # s per attempt, total, GPU-h
    assert lines["productive"][-4:] == ["50.0", "70.0", "120.0", "0.2667"]
    assert lines["queued (not billed)"][-2:] == ["50.0", "-"]
    assert "goodput (productive / billed GPU-hours)   47.2%: 0.2667 / 0.5644" in out
    assert "recovery time (signal -> next first step) 77.5s" in out
    assert "estimated cost                            $0.81" in out
    assert "on-demand equivalent                      $2.31" in out
    assert "estimated spot savings                    $1.50 (65%)" in out
    assert "attempt 1: preempted, spot p4d.24xlarge, 8 accelerator(s), 0.2889 GPU-hours billed" in out
    assert "[1] typical spot price as of 2024-12-01" in out


def test_a_run_that_ended_since_this_version_prints_its_stored_bill(run, capsys):
    layout, store = run
    job = store.get_json(layout.job)
    cost = account(job, [], FIXTURE_PRICES)  # no metrics: a bill unlike the recomputed one
    store.put_json(layout.job, {**job, "cost": dict(cost)})
    assert main(["cost", layout.run_uri + "/"]) == 0
    out = capsys.readouterr().out
    assert "prices: as priced when the run ended" in out
    assert f"estimated cost                            ${cost['cost']:.2f}" in out


def cost_of(tmp_path, capsys, job, metrics) -> tuple[str, dict[str, list[str]]]:
    """``trainops cost`` of a stored run: what it printed, and its lines by their first column."""
    layout = RunLayout((tmp_path / "runs" / "nightly" / "r2" / "train").as_uri())
    store = open_storage(layout.run_uri)
    store.put_json(layout.job, {**job, "run_uri": layout.run_uri})
    body = "".join(json.dumps(r) + "\n" for r in metrics)
    store.put(f"{layout.metrics_parts}/{metrics_part_name(1, 1)}", body.encode())
    assert main(["cost", layout.run_uri]) == 0
    out = capsys.readouterr().out
    return out, {line.split("  ")[0]: line.split() for line in out.splitlines()}


def test_a_run_restarted_in_place_shows_the_restart_and_its_recovery(tmp_path, capsys):
    out, lines = cost_of(tmp_path, capsys, *one_restart_job())
    assert lines["restart in place"][-3:] == ["13.0", "13.0", "0.0289"]  # s, total, GPU-h (13 x 8)
    assert lines["replayed (steps lost)"][-3:] == ["5.0", "5.0", "0.0111"]
    assert "recovery time (signal -> next first step) 10.0s" in out
    assert lines["recovery"][1:3] == ["9.0", "72.0"]  # the restart less its 4 s restore, x 8 GPUs


def test_a_run_without_a_restart_in_place_or_a_rollback_has_no_such_row(run, capsys):
    layout, store = run
    job = store.get_json(layout.job)
    cost = account(job, [], FIXTURE_PRICES)
    for phase in ("restart", "rollback"):  # a bill stored before in-place restarts and rollbacks
        cost["seconds"].pop(phase)
        for attempt in cost["attempts"]:
            attempt["seconds"].pop(phase)
    store.put_json(layout.job, {**job, "cost": dict(cost)})
    assert main(["cost", layout.run_uri]) == 0
    out = capsys.readouterr().out
    assert "restart in place" not in out and "rolled back" not in out


def test_a_run_that_rolled_back_shows_the_rollback_and_its_causes(tmp_path, capsys):
    _, lines = cost_of(tmp_path, capsys, *one_rollback_job())
    assert lines["rolled back (bad loss)"][-3:] == ["8.0", "8.0", "0.0178"]  # s, total, GPU-h (8 x 8)
    assert lines["restore (checkpoint load)"][-4:-2] == ["3.0", "24.0"]  # its recorded load, x 8 GPUs
    assert lines["lost progress (replayed or rolled-back steps)"][-4:-2] == ["5.0", "40.0"]


def test_prices_from_a_file_are_laid_over_the_shipped_table(run, tmp_path, capsys):
    layout, _ = run
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"p4d.24xlarge": {"spot": {"per_hour": 8.0}}}))
    assert main(["cost", layout.run_uri, "--prices", str(prices)]) == 0
    out = capsys.readouterr().out
    assert f"prices: --prices {prices} + default table" in out
    assert f"estimated cost                            ${254 * 8 / 3600 * 1.0:.2f}" in out  # $8/8 GPUs
    assert f"[1] --prices {prices}" in out


def test_no_run_or_bad_prices_exit_1_saying_why(run, tmp_path, capsys):
    layout, _ = run
    assert main(["cost", (tmp_path / "nothing").as_uri()]) == 1
    assert "no job.json at" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text('{"p4d.24xlarge": {"spot": {"per_hour": -3}}}')
    assert main(["cost", layout.run_uri, "--prices", str(bad)]) == 1
    assert "p4d.24xlarge spot: per_hour must be >= 0" in capsys.readouterr().err
    assert main(["cost", layout.run_uri, "--prices", str(tmp_path / "missing.json")]) == 1
    assert "missing.json" in capsys.readouterr().err


def test_an_unknown_instance_type_is_noted_plainly(run, capsys):
    layout, store = run
    job = store.get_json(layout.job)
    for entry in job["attempts"]:
        entry["node_types"][0]["instance_type"] = "p9.fake"
    store.put_json(layout.job, job)
    assert main(["cost", layout.run_uri]) == 0
    out = capsys.readouterr().out
    assert (
        "notes:\n- attempt 1: default per-GPU-hour (unknown instance type p9.fake): priced at $1.40/GPU-hour spot"
        in out
    )


def test_a_run_is_named_by_its_folder_latest_or_dag_and_run_id(run, tmp_path, capsys, monkeypatch):
    layout, _ = run
    monkeypatch.setenv("TRAINOPS_STORAGE_ROOT", tmp_path.as_uri())
    monkeypatch.chdir(tmp_path)
    for given in ("runs/nightly/r1/train", "latest", "nightly/r1", "./runs/nightly/r1/train/job.json"):
        assert main(["cost", given]) == 0, given
        assert capsys.readouterr().out.startswith(f"Estimated cost of {layout.run_uri}\n")
    assert main(["cost", "no such thing"]) == 2
    assert "expected a run URI" in capsys.readouterr().err


def test_an_s3_run_without_credentials_is_one_line_naming_the_connection(tmp_path):
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("AWS_") and not k.startswith("AIRFLOW_CONN_")
    }
    env.update(
        AWS_EC2_METADATA_DISABLED="true",
        AWS_SHARED_CREDENTIALS_FILE="/nonexistent",
        AWS_CONFIG_FILE="/nonexistent",
        TRAINOPS_STORAGE_OUTAGE_TOLERANCE_S="2",
    )
    done = subprocess.run(
        [sys.executable, "-m", "trainops", "cost", "s3://no-credentials-bucket/root/runs/nightly/r1/train"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        cwd=tmp_path,
    )
    assert done.returncode == 2 and done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert line.startswith(
        "cost: no credentials to read s3://no-credentials-bucket/root/runs/nightly/r1/train/job.json"
    )
    assert "'aws_default'" in line and "AWS_ACCESS_KEY_ID" in line


def test_lost_time_by_cause_is_printed_and_adds_up_to_the_billed_time(run, capsys):
    layout, store = run
    job = store.get_json(layout.job)
    job["attempts"][1]["record"]["restore_s"] = 5.0
    store.put_json(layout.job, job)
    assert main(["cost", layout.run_uri]) == 0
    out = capsys.readouterr().out
    rows = {line.split("  ")[0]: line.split() for line in out.splitlines()}
    # wall s, GPU-s billed, cost, GPU-s not billed (8 GPUs at $11.4704 / 8 per GPU-hour)
    assert rows["startup"][-4:] == ["95.0", "760.0", "$0.30", "0.0"]
    assert rows["restore (checkpoint load)"][-4:] == ["5.0", "40.0", "$0.02", "0.0"]
    assert rows["checkpoint save"][-4:] == ["18.0", "144.0", "$0.06", "0.0"]
    assert rows["lost progress (replayed or rolled-back steps)"][-4:] == ["10.0", "80.0", "$0.03", "0.0"]
    # the preempted attempt's shutdown (6 s billed) and the 10 s before the relaunch (not billed)
    assert rows["recovery"][-4:] == ["16.0", "48.0", "$0.02", "80.0"]
    assert rows["waiting for capacity (not billed)"][-4:] == ["50.0", "0.0", "$0.00", "400.0"]
    assert "productive + causes = billed: 960.0 + 1072.0 = 2032.0 GPU-s, $0.38 + $0.43 = $0.81" in out


def test_json_gives_the_bill_and_its_lost_time_by_cause(run, capsys):
    layout, _ = run
    assert run_cost(layout.run_uri, None, as_json=True) == 0
    bill = json.loads(capsys.readouterr().out)
    assert bill["format"] == "trainops.cost/v1" and bill["run_uri"] == layout.run_uri
    lost = bill["lost_by_cause"]
    assert [c["cause"] for c in lost["causes"]] == list(CAUSES)
    assert lost["productive_gpu_s"] + sum(c["gpu_s"] for c in lost["causes"]) == pytest.approx(
        bill["billed_gpu_hours"] * 3600
    )
    assert sum(c["cost"] for c in lost["causes"]) + lost["productive_cost"] == pytest.approx(bill["cost"])
    # no restore_s in this run's records: the load stays in startup, and the notes say so
    assert any("no restore_s" in note for note in lost["notes"])
