"""The trainer image's dependency set: ``.[trainer]`` works alone and never brings Airflow."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCKERFILE = REPO / "docker" / "trainer.Dockerfile"
ENTRYPOINT = REPO / "docker" / "trainer-entrypoint.sh"
# What the Dockerfile copies before `pip install .[trainer]`; the slow test builds from exactly this.
BUILD_INPUTS = ("pyproject.toml", "constraints.txt", "README.md", "trainer", "plugins/trainops")


def _instructions(text: str) -> list[tuple[str, str]]:
    joined = re.sub(r"\\\n", " ", text)
    return [
        (line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line.strip() else "")
        for line in (raw.strip() for raw in joined.splitlines())
        if line and not line.startswith("#")
    ]


def test_dockerfile_installs_only_the_trainer_extra_and_runs_as_non_root():
    instructions = _instructions(DOCKERFILE.read_text())
    runs = " ".join(arg for op, arg in instructions if op == "RUN")
    assert re.search(r"pip install -c constraints.txt \"\.\[trainer\]\"", runs)
    assert not re.search(r"\[[^\]]*airflow", DOCKERFILE.read_text()), (
        "the trainer image must not install [airflow]"
    )
    users = [arg for op, arg in instructions if op == "USER"]
    assert users and users[-1] == "10001:10001"  # the last USER wins; numeric so runAsNonRoot can check it
    assert "useradd --uid 10001" in runs and "chown 10001:10001 /var/cache/trainops" in runs
    envs = " ".join(arg for op, arg in instructions if op == "ENV")
    assert "TRAINOPS_CACHE_DIR=/var/cache/trainops" in envs
    assert ("ENTRYPOINT", '["/usr/local/bin/trainer-entrypoint"]') in instructions
    copied = " ".join(arg for op, arg in instructions if op == "COPY")
    for path in BUILD_INPUTS:
        assert path in copied, f"the Dockerfile does not copy {path}"
    assert "docker/trainer-entrypoint.sh /usr/local/bin/trainer-entrypoint" in copied


def _entrypoint(*args: str, cache: Path) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "TRAINOPS_CACHE_DIR": str(cache),
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
    }
    return subprocess.run(["sh", str(ENTRYPOINT), *args], env=env, capture_output=True, text=True, timeout=60)


def test_entrypoint_runs_contract_argv_and_shorthands(tmp_path):
    cache = tmp_path / "cache" / "nested"
    plain = _entrypoint("python", "-c", "import os; print(os.environ['TRAINOPS_CACHE_DIR'])", cache=cache)
    assert plain.returncode == 0 and plain.stdout.strip() == str(cache) and cache.is_dir()
    trainer = _entrypoint("train", "--help", cache=cache)
    assert trainer.returncode == 0 and "usage: python -m trainer train" in trainer.stdout
    torchrun = _entrypoint("--help", cache=cache)
    assert torchrun.returncode == 0 and "--nproc-per-node" in torchrun.stdout
    unset = subprocess.run(
        ["sh", str(ENTRYPOINT), "true"], env={"PATH": os.environ["PATH"]}, capture_output=True, text=True
    )
    assert unset.returncode != 0 and "TRAINOPS_CACHE_DIR must be set" in unset.stderr


@pytest.mark.slow
def test_trainer_extra_installs_alone_without_airflow(tmp_path):
    src = tmp_path / "src"  # a copy, so the build leaves no build/ or egg-info in the checkout
    for name in BUILD_INPUTS:
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(REPO / name, src / name)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    # --no-compile: byte-compiling torch's thousands of files is most of the install's CPU time,
    # and whether the extra installs alone does not depend on it.
    install = subprocess.run(
        [
            python,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-compile",
            "-c",
            str(src / "constraints.txt"),
            f"{src}[trainer]",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [python, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
        )

    no_airflow = run("-c", "import airflow")
    assert no_airflow.returncode != 0 and "No module named 'airflow'" in no_airflow.stderr
    modules = run(
        "-c",
        "import torch, trainer.train, trainer.models.builder, trainer.models.hf, trainer.export.folder, "
        "trainer.evaluate; print(torch.__version__, trainer.__file__)",
    )
    assert modules.returncode == 0, modules.stderr
    assert modules.stdout.startswith("2.13.0") and str(venv) in modules.stdout  # installed, not the checkout
    top = run("-m", "trainer", "--help")
    assert top.returncode == 0 and all(c in top.stdout for c in ("train", "evaluate", "export"))
    train = run("-m", "trainer", "train", "--help")
    assert train.returncode == 0
    for key in (
        "run_uri",
        "model.preset",
        "model.builder",
        "train.lr",
        "checkpoint.every_steps",
        "eval.model_uri",
    ):
        assert key in train.stdout, f"{key} missing from `trainer train --help`"
