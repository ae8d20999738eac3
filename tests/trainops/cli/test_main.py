"""``python -m trainops``: the commands a user types, their output and exit status."""

from __future__ import annotations

import getpass
import os
import subprocess
import sys

import pytest

from tests.trainops.registry.helpers import promote_runs
from trainer.storage import open_storage
from trainops.cli.main import load_dag, main
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
    assert out.stdout.startswith("usage: python -m trainops [-h] {demo,airflow,render-job,rollback,cost} ...")
    text = " ".join(out.stdout.split())  # argparse wraps to the terminal's width
    for command, what in (
        ("demo", "run the demo DAG on the embedded default and print a summary"),
        ("airflow", "run Airflow (standalone) on the embedded default"),
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
    out = capsys.readouterr().out
    assert code == 0
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
    assert out == f"demo-lm: v1 already is production (since {at}, rollback by ana); nothing changed\n"


def test_cli_reports_a_refusal_on_stderr_with_status_1(file_root, capsys):
    promote_runs(open_storage(file_root), file_root, 1)
    code = main(["rollback", "demo-lm", "5", "--reason", "x", "--by", "ci", "--storage-root", file_root])
    assert code == 1
    assert "rollback failed: 'demo-lm' has no version 5" in capsys.readouterr().err


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
    assert "production is now v1 (was v2)" in out.stdout
    entry = read_production(storage, file_root, "demo-lm")["history"][-1]
    assert (entry["by"], entry["reason"], entry["action"]) == ("oncall", "bad answers", "rollback")
