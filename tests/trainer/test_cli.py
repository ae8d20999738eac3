"""``python -m trainer``: arguments, help, and config errors reported before torch is imported."""

import subprocess
import sys

from tests.trainer.helpers import REPO, write_config


def test_cli_exits_2_with_one_line_before_importing_torch(tmp_path):
    path = write_config(tmp_path / "c.yaml", run_uri="file:///runs/r1", data_uri="file:///datasets/demo/v1")
    code = (
        "import sys; from trainer.cli import main; rc = main(sys.argv[1:]); "
        "print('torch imported' if 'torch' in sys.modules else 'torch not imported'); sys.exit(rc)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, "train", "--config", str(path), "train.lrr=0.1"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 2
    assert proc.stderr == "error: unknown key 'train.lrr' (did you mean 'train.lr'?)\n"
    assert proc.stdout.strip() == "torch not imported"


def test_cli_help_lists_commands_and_keys():
    proc = subprocess.run(
        [sys.executable, "-m", "trainer", "--help"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0
    for word in ("train", "evaluate", "export", "checkpoint.every_steps"):
        assert word in proc.stdout


def test_a_config_that_storage_cannot_serve_fails_in_one_line(monkeypatch, capsys):
    # an outage as torchrun restarts the workers in place: one line each, so that the record rank
    # 0 printed before stays in the log tail the operator reads
    from trainer import cli
    from trainer.storage import StorageUnavailable

    def down(uri, overrides):
        raise StorageUnavailable(f"storage: GET {uri} kept failing (503 SlowDown)")

    monkeypatch.setattr(cli, "load_config", down)
    assert cli.main(["train", "--config", "s3://b/run/config.yaml"]) == 1
    err = capsys.readouterr().err
    assert err.splitlines() == [
        "error: could not read the config s3://b/run/config.yaml: storage: GET s3://b/run/config.yaml kept "
        "failing (503 SlowDown)"
    ]
