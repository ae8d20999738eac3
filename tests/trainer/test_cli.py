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
