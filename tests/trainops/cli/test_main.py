"""``python -m trainops``: the commands a user types, their output and exit status."""

from __future__ import annotations

import getpass
import os
import subprocess
import sys

import pytest

from tests.trainops.registry.helpers import promote_runs
from trainer.storage import open_storage
from trainops.cli.main import demo_conf, load_dag, main
from trainops.registry.promotion import read_production

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def python_m_trainops(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "trainops", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=60,
    )


def test_help_lists_every_command():
    out = python_m_trainops("--help")
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())  # argparse wraps to the terminal's width
    assert text.startswith(
        "usage: python -m trainops [-h] {demo,airflow,doctor,runs,status,logs,models,report,render-job,rollback,cost} ..."
    )
    for command, what in (
        ("demo", "run the demo DAG on the embedded default and print a summary"),
        ("airflow", "run Airflow (standalone) on the embedded default"),
        ("doctor", "check a cluster and a storage root before the first run (read-only)"),
        ("runs", "recent runs and their outcomes"),
        ("status", "where a run stands, and its outcome"),
        ("logs", "a run's attempts' log tails (-f follows a live run)"),
        ("models", "production models; with NAME, its history: who and why"),
        ("report", "the URL of a run's report or a model's card (--open opens it)"),
        ("render-job", "print the Kubernetes manifests of a JobSpec (dry run)"),
        ("rollback", "point a model's production back at an earlier version"),
        ("cost", "print the estimated cost, goodput and phases of one training run"),
    ):
        assert f"{command} {what}" in text


def test_no_command_or_missing_arguments_print_usage_with_status_2():
    bare = python_m_trainops()
    assert bare.returncode == 2 and "the following arguments are required: command" in bare.stderr
    with pytest.raises(SystemExit) as exit_:
        main(["rollback", "demo-lm", "1"])
    assert exit_.value.code == 2


@pytest.mark.parametrize("bad", ["x", "-1", "4294967296", "2.5"])
def test_a_bad_demo_seed_is_refused_before_anything_runs(bad, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["demo", "--seed", bad])
    assert exit_.value.code == 2
    assert (
        f"argument --seed: expected a whole number from 0 to 4294967295, got '{bad}'"
        in capsys.readouterr().err
    )


def test_only_a_seed_given_on_the_command_line_reaches_the_demo_run():
    # Without --seed the DAG's own default holds: make demo trains what it always trained.
    assert demo_conf(False, None) == {"corrupt_data": False}
    assert demo_conf(True, 2) == {"corrupt_data": True, "seed": 2}


def test_load_dag_imports_one_file_of_a_dags_folder(tmp_path):
    (tmp_path / "my_dag.py").write_text("dag = {'dag_id': 'my_dag'}\n")
    assert load_dag(str(tmp_path), "my_dag") == {"dag_id": "my_dag"}
    with pytest.raises(FileNotFoundError):
        load_dag(str(tmp_path), "missing")


# ------------------------------------------------------------------------------ rollback


def test_cli_rolls_back_and_prints_what_changed(file_root, capsys):
    storage = open_storage(file_root)
    promote_runs(storage, file_root, 2)
    code = main(["rollback", "demo-lm", "1", "--reason", "v2 regressed", "--storage-root", file_root])
    first, out = capsys.readouterr().out.split("\n", 1)
    assert code == 0
    assert first == f"storage root: {file_root} (from --storage-root)"
    assert out.startswith("demo-lm: production is now v1 (was v2); recorded in ")
    assert f"as rollback by {getpass.getuser()}: v2 regressed" in out
    assert read_production(storage, file_root, "demo-lm")["history"][-1]["by"] == getpass.getuser()


def test_cli_says_when_and_how_a_version_already_became_production(file_root, capsys):
    storage = open_storage(file_root)
    promote_runs(storage, file_root, 2)
    assert (
        main(
            [
                "rollback",
                "demo-lm",
                "1",
                "--reason",
                "v2 regressed",
                "--by",
                "ana",
                "--storage-root",
                file_root,
            ]
        )
        == 0
    )
    capsys.readouterr()
    code = main(["rollback", "demo-lm", "1", "--reason", "again", "--by", "ben", "--storage-root", file_root])
    out = capsys.readouterr().out
    at = read_production(storage, file_root, "demo-lm")["history"][-1]["at"]
    assert code == 0
    assert out == (
        f"storage root: {file_root} (from --storage-root)\n"
        f"demo-lm: v1 already is production (since {at}, rollback by ana); nothing changed\n"
    )


def test_cli_reports_a_refusal_on_stderr_with_status_1(file_root, capsys):
    promote_runs(open_storage(file_root), file_root, 1)
    code = main(["rollback", "demo-lm", "5", "--reason", "x", "--by", "ci", "--storage-root", file_root])
    assert code == 1
    assert "rollback failed: 'demo-lm' has no version 5" in capsys.readouterr().err


def test_cli_refuses_a_model_name_that_is_not_one_when_it_parses_the_command_line(file_root, capsys):
    with pytest.raises(SystemExit) as exited:
        main(["rollback", "x" * 300, "1", "--reason", "r", "--by", "ci", "--storage-root", file_root])
    err = capsys.readouterr().err
    assert exited.value.code == 2
    assert "argument MODEL: model name 'xxxx" in err and "is 300 characters long; at most 128" in err
    assert "storage root" not in err  # refused before any storage was chosen or read


def test_cli_refuses_to_roll_back_another_models_registry_naming_both(file_root, capsys):
    storage = open_storage(file_root)
    promote_runs(storage, file_root, 2, name="fraud_model")
    uri = f"{file_root}/models/fraud_model/production.json"
    storage.put_json(uri, {**storage.get_json(uri), "model": "fraud model"})  # trainops before #25
    code = main(["rollback", "fraud_model", "1", "--reason", "r", "--by", "ci", "--storage-root", file_root])
    assert code == 1
    assert (
        f"rollback failed: {uri} records model 'fraud model', not 'fraud_model': " in capsys.readouterr().err
    )
    assert storage.get_json(uri)["version"] == 2


def test_python_m_trainops_rollback_uses_the_default_storage_root(file_root):
    storage = open_storage(file_root)
    promote_runs(storage, file_root, 2)
    env = {**os.environ, "TRAINOPS_STORAGE_ROOT": file_root}
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainops",
            "rollback",
            "demo-lm",
            "1",
            "--reason",
            "bad answers",
            "--by",
            "oncall",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"storage root: {file_root} (from $TRAINOPS_STORAGE_ROOT)\n")
    assert "production is now v1 (was v2)" in out.stdout
    entry = read_production(storage, file_root, "demo-lm")["history"][-1]
    assert (entry["by"], entry["reason"], entry["action"]) == ("oncall", "bad answers", "rollback")


def test_rollback_from_a_fresh_shell_in_the_checkout_uses_where_make_demo_wrote(tmp_path):
    """No ``TRAINOPS_STORAGE_ROOT``, no ``AIRFLOW_HOME``: the checkout's embedded default, as
    ``demo`` applies it, not ``~/airflow/trainops-storage``; ``--help`` and the first line say so."""
    checkout = tmp_path / "checkout"
    (checkout / "dags").mkdir(parents=True)
    (checkout / "plugins" / "trainops").mkdir(parents=True)
    root = f"file://{checkout / '.trainops' / 'storage'}"
    promote_runs(open_storage(root), root, 2)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRAINOPS_", "AIRFLOW"))}
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(REPO, "plugins"), REPO])
    env["HOME"] = str(tmp_path / "home")
    run = [sys.executable, "-m", "trainops", "rollback", "demo-lm", "1", "--reason", "r", "--by", "me"]
    out = subprocess.run(run, capture_output=True, text=True, env=env, cwd=checkout, timeout=60)
    assert out.returncode == 0, out.stderr
    first, rest = out.stdout.split("\n", 1)
    assert first == f"storage root: {root} (the embedded default of the checkout {checkout})"
    assert rest.startswith("demo-lm: production is now v1 (was v2)")
    wide = {**env, "COLUMNS": "1000"}  # argparse wraps long paths at their hyphens
    helped = subprocess.run(
        [*run[:3], "rollback", "--help"], capture_output=True, text=True, env=wide, cwd=checkout, timeout=60
    )
    assert f"here: {root}, the embedded default of the checkout {checkout})" in helped.stdout
    assert not (tmp_path / "home" / "airflow" / "trainops-storage").exists()
