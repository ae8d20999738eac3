"""The terminal's verbs on a storage root holding one run of each outcome: what a person reads,
what ``--json`` gives back, one line and exit status 2 for bad input, and no Airflow import."""

import argparse
import json
import os
import subprocess
import sys

import pytest

from tests.trainops.runs.stored import attempt, every_outcome, write_run
from trainer.contract import metrics_part_name
from trainer.storage import open_storage
from trainops.cli import runs as verbs
from trainops.cli.runs import run_verb


@pytest.fixture
def root(file_root, monkeypatch):
    monkeypatch.setenv("TRAINOPS_STORAGE_ROOT", file_root)
    return file_root, every_outcome(file_root)


def test_runs_lists_every_outcome_newest_first(root, capsys):
    assert run_verb(["runs"]) == 0
    out = capsys.readouterr().out
    rows = out.splitlines()
    assert rows[0].startswith("storage root: ")
    assert rows[1].split() == ["DAG", "RUN", "STARTED", "TOOK", "COST", "OUTCOME"]
    texts = rows[2:7]
    assert "running: step 40/100" in texts[0]
    assert "failed at train: program error: ValueError: bad batch" in texts[1]
    assert "identical to production v2" in texts[2]
    assert (
        "rejected: eval loss under max_eval_loss: eval_loss (observed 3.2, expected <= 2.5) (+1 more)"
        in texts[3]
    )
    assert texts[4].endswith("promoted v2") and "$0.25" in texts[4]


def test_runs_json_round_trips(root, capsys):
    assert run_verb(["runs", "--json", "--dag", "retrain"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert [r["outcome"]["kind"] for r in found] == ["failed", "identical", "rejected", "promoted"]
    assert json.loads(json.dumps(found)) == found and {"run_uri", "dag_id", "run_id", "status"} <= set(
        found[0]
    )


def test_status_latest_shows_progress_and_the_report(root, capsys):
    assert run_verb(["status", "latest"]) == 0
    out = capsys.readouterr().out
    assert "outcome   running: step 40/100" in out and "progress  step 40 of 100" in out
    assert "report    http://localhost:8080/trainops/report?uri=file%3A%2F%2F" in out


def test_status_of_a_rejected_run_lists_the_checks(root, capsys):
    _, runs = root
    assert run_verb(["status", runs["rejected"], "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert found["outcome"]["kind"] == "rejected"
    assert run_verb(["status", "retrain/manual__2026-12-02T10:00:00+00:00"]) == 0
    out = capsys.readouterr().out
    assert "gate      FAIL eval loss under max_eval_loss: observed 3.2, expected <= 2.5" in out
    assert "gate      pass perplexity" in out


def test_logs_print_each_attempts_tail(root, capsys):
    _, runs = root
    assert run_verb(["logs", runs["failed"]]) == 0
    out = capsys.readouterr().out
    assert "== attempt 1: failed (train-0123abcd-a1" in out and "ValueError: bad batch" in out
    assert run_verb(["logs", "latest"]) == 0
    assert "no log kept yet" in capsys.readouterr().out


def test_logs_say_an_attempts_restarts_in_place_above_its_tail(root, capsys):
    file_root, _ = root
    restarts = [{"restart": 0, "outcome": "failed", "cause": "node", "error": "no GPU 3"}]
    run = write_run(
        file_root,
        "nightly",
        "manual__2026-12-09T00:00:00+00:00",
        status="succeeded",
        attempts=[attempt(1, "succeeded", "completed: 100 steps", record={"restarts": restarts})],
    )
    assert run_verb(["logs", run]) == 0
    out = capsys.readouterr().out
    assert "== attempt 1: succeeded (train-0123abcd-a1, " in out
    assert "; restarted in place 1× (node: no GPU 3)\ncompleted: 100 steps" in out


def test_logs_follow_a_live_run_until_it_ends(root, capsys, monkeypatch):
    file_root, _ = root
    polls = []

    def sleep(seconds):  # the run moves on while -f waits: 60 more steps, then it ends with its log
        polls.append(seconds)
        run = write_run(
            file_root,
            "nightly",
            "scheduled__2026-12-05T00:00:00+00:00",
            status="succeeded",
            attempts=[attempt(1, "succeeded", "completed: 100 steps")],
        )
        more = "".join(
            json.dumps({"step": s, "attempt": 1, "loss": 2.0, "time": 1000.0 + s}) + "\n"
            for s in range(41, 101)
        )
        open_storage(run).put(f"{run}/metrics/{metrics_part_name(1, 2)}", more.encode())

    parser_args = ["logs", "latest", "-f"]
    parser = argparse.ArgumentParser()
    verbs.add_parsers(parser.add_subparsers(dest="command"))
    assert verbs.cmd_logs(parser.parse_args(parser_args), sleep=sleep) == 0
    out = capsys.readouterr().out
    assert "step 40: loss 2" in out and "step 100: loss 2" in out
    assert "completed: 100 steps" in out and out.rstrip().endswith("the run ended: succeeded")
    assert polls == [verbs.FOLLOW_EVERY_S]


def test_models_and_a_models_history(root, capsys):
    assert run_verb(["models"]) == 0
    out = capsys.readouterr().out
    assert "demo-lm" in out and "v2" in out and "promote by alice" in out
    assert run_verb(["models", "demo-lm"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("demo-lm: production v2 since 2026-12-01 11:00:00")
    assert "v2  promote  2026-12-01 11:00:00  by alice" in out and "model card: http://" in out
    assert run_verb(["models", "demo-lm", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["version"] == 2


def test_report_of_a_run_and_of_a_model(root, capsys, monkeypatch):
    opened = []
    monkeypatch.setattr(verbs.webbrowser, "open", opened.append)
    assert run_verb(["report", "latest", "--airflow-url", "http://airflow.example:8080/", "--open"]) == 0
    url = capsys.readouterr().out.strip()
    assert url.startswith("http://airflow.example:8080/trainops/report?uri=file%3A%2F%2F") and url.endswith(
        "job.json"
    )
    assert opened == [url]
    assert run_verb(["report", "demo-lm"]) == 0
    assert capsys.readouterr().out.strip().endswith("versions%2F2%2Fcard.json")


@pytest.mark.parametrize(
    "argv,said",
    [
        (["status", "not a run"], "expected a run URI"),
        (["status", "retrain/nope"], "no run there"),
        (["logs", "retrain/nope"], "no readable job.json"),
        (["models", "nope"], "no model 'nope'"),
    ],
)
def test_bad_input_is_one_line_and_exit_status_2(root, capsys, argv, said):
    assert run_verb(argv) == 2
    err = capsys.readouterr().err
    assert said in err and err.count("\n") == 1


def test_an_s3_root_without_credentials_says_what_to_set(capsys, monkeypatch):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    assert run_verb(["runs", "--storage-root", "s3://no-credentials-bucket/root"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no credentials" in err and "aws_default" in err


def test_the_verbs_import_no_airflow(root):
    file_root, _ = root
    code = (
        "import sys\n"
        "from trainops.cli.runs import run_verb\n"
        "for argv in (['runs'], ['status', 'latest'], ['logs', 'latest'], ['models'], ['models', 'demo-lm'],"
        " ['report', 'latest']):\n"
        "    assert run_verb(argv) == 0, argv\n"
        "print(sorted(m for m in sys.modules if m == 'airflow' or m.startswith('airflow.')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "TRAINOPS_STORAGE_ROOT": file_root},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "[]"


def test_models_whose_names_needed_a_hashed_folder_are_listed_by_their_name(root, capsys):
    from tests.trainops.runs.stored import promote

    file_root, runs = root
    store = open_storage(file_root)
    promote(file_root, "demo-lm", 2, runs["promoted"])
    folder = f"{file_root}/models/org~hash/production.json"
    store.put(folder, json.dumps({"model": "org/model", "version": 3, "history": []}).encode())
    assert run_verb(["models", "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert found["org/model"]["version"] == 3 and found["demo-lm"]["version"] == 2


@pytest.mark.parametrize("argv", [["report", "."], ["report", ".."], ["models", ".."]])
def test_a_name_that_cannot_be_a_folder_is_one_line(root, capsys, argv):
    assert run_verb(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
