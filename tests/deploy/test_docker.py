"""The Dockerfiles, read without a Docker engine: base image pins, what each stage installs,
what it copies (and whether the build context lets it), and the user it ends as."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[2]
AIRFLOW_DOCKERFILE = REPO / "docker" / "airflow.Dockerfile"
AIRFLOW_DOCKERIGNORE = REPO / "docker" / "airflow.Dockerfile.dockerignore"
TRAINER_DOCKERFILE = REPO / "docker" / "trainer.Dockerfile"
CPU_TORCH_INDEX = "https://download.pytorch.org/whl/cpu"


# ----------------------------------------------------------------------------- parsing


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def args(self, op: str) -> list[str]:
        return [arg for name, arg in self.instructions if name == op]


def parse_dockerfile(path: Path) -> tuple[dict[str, str], list[Stage]]:
    """Global ARG defaults and the stages, each with its (INSTRUCTION, arguments) list.

    Comment lines go first (Docker drops them even inside a continued instruction), then
    backslash continuations are joined.
    """
    lines = [line for line in path.read_text().splitlines() if not line.lstrip().startswith("#")]
    text = re.sub(r"\\[ \t]*\n", " ", "\n".join(lines))
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in filter(None, (raw.strip() for raw in text.splitlines())):
        op, _, arg = line.partition(" ")
        op, arg = op.upper(), arg.strip()
        if op == "FROM":
            words = arg.split()
            words = [w for w in words if not w.startswith("--")]
            base = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: global_args[m.group(1) or m.group(2)], words[0])
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append(Stage(base=base, name=name))
        elif not stages:
            assert op == "ARG", f"{path.name}: only ARG may come before FROM, found {op}"
            key, _, default = arg.partition("=")
            global_args[key] = default.strip('"')
        else:
            stages[-1].instructions.append((op, arg))
    return global_args, stages


def copy_sources(stage: Stage) -> list[tuple[str, str]]:
    """(source, destination) of every COPY/ADD from the build context (not ``--from``)."""
    pairs = []
    for op, arg in stage.instructions:
        if op not in ("COPY", "ADD"):
            continue
        words = shlex.split(arg)
        if any(w.startswith("--from") for w in words):
            continue
        paths = [w for w in words if not w.startswith("--")]
        *sources, destination = paths
        pairs.extend((source, destination) for source in sources)
    return pairs


def pip_installs(stage: Stage) -> list[list[str]]:
    """The argument lists of the ``pip install`` commands in a stage's RUN instructions."""
    commands = []
    for run in stage.args("RUN"):
        for command in re.split(r"&&|;|\|\|", run):
            words = command.split()
            if words[:2] == ["pip", "install"] or words[1:4] == ["-m", "pip", "install"]:
                commands.append(words[words.index("install") + 1 :])
    return commands


def _stage(stages: list[Stage], name: str) -> Stage:
    return next(stage for stage in stages if stage.name == name)


def stage_chain(stages: list[Stage], stage: Stage) -> list[Stage]:
    """The stage and the stages it is built on, nearest first."""
    names = {s.name: s for s in stages}
    chain = [stage]
    while chain[-1].base in names:
        chain.append(names[chain[-1].base])
    return chain


def dockerignore(path: Path):
    """``ignored(relative_path)`` with Docker's rules: the last matching pattern wins, ``!``
    re-includes, and a pattern that matches a directory matches everything below it."""
    rules = []
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = line.lstrip("!").strip().strip("/")
        regex = ""
        for token in re.split(r"(\*\*/|\*\*|\*|\?)", pattern):
            regex += {"**/": "(?:.*/)?", "**": ".*", "*": "[^/]*", "?": "[^/]"}.get(token, re.escape(token))
        rules.append((negate, re.compile(regex)))

    def ignored(relative: str) -> bool:
        parts = relative.strip("/").split("/")
        prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
        result = False
        for negate, regex in rules:
            if any(regex.fullmatch(prefix) for prefix in prefixes):
                result = not negate
        return result

    return ignored


def _files_under(source: str) -> list[str]:
    path = REPO / source
    if path.is_file():
        return [source.rstrip("/")]
    return [
        p.relative_to(REPO).as_posix()
        for p in path.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    ]


def _constraint(name: str) -> str:
    pins = dict(
        line.split("==", 1)
        for line in (REPO / "constraints.txt").read_text().splitlines()
        if "==" in line and not line.startswith("#")
    )
    return pins[name]


@pytest.fixture(scope="module")
def airflow_image():
    return parse_dockerfile(AIRFLOW_DOCKERFILE)[1]


# ----------------------------------------------------------------------------- airflow image


def test_parser_reads_continuations_comments_and_stages(tmp_path):
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text(
        "ARG BASE=img:1\nFROM ${BASE} AS one\n# note\nRUN a \\\n# inside\n    && b\n"
        "COPY --chown=x:0 a.txt b/ /dst/\nFROM one\nUSER 10\n"
    )
    args, stages = parse_dockerfile(dockerfile)
    assert args == {"BASE": "img:1"}
    assert [(s.base, s.name) for s in stages] == [("img:1", "one"), ("one", None)]
    assert [" ".join(run.split()) for run in stages[0].args("RUN")] == ["a && b"]
    assert copy_sources(stages[0]) == [("a.txt", "/dst/"), ("b/", "/dst/")]
    assert stages[1].args("USER") == ["10"]


def test_base_image_pins_the_airflow_version_of_constraints(airflow_image):
    base = airflow_image[0].base
    match = re.fullmatch(r"apache/airflow:(?P<airflow>[\d.]+)-python(?P<python>\d+\.\d+)", base)
    assert match, f"the Airflow image must start from a pinned official image, not {base!r}"
    assert match["airflow"] == _constraint("apache-airflow")
    requires_python = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"]
    assert match["python"] in SpecifierSet(requires_python)
    # the build itself refuses an image whose Airflow differs from the pin
    runs = " ".join(airflow_image[0].args("RUN"))
    assert "s/^apache-airflow==//p" in runs and "import airflow; print(airflow.__version__)" in runs


def test_production_is_the_default_target_and_dev_a_variant_of_the_same_base(airflow_image):
    assert [s.name for s in airflow_image] == ["base", "dev", "airflow"]
    production = airflow_image[-1]  # `docker build` without --target builds the last stage
    assert production.name == "airflow" and production.base == "base"
    assert _stage(airflow_image, "dev").base == "base"
    assert not production.args("RUN") and not copy_sources(production)


def test_base_stage_installs_the_airflow_extra_with_constraints_and_no_torch(airflow_image):
    base = _stage(airflow_image, "base")
    installs = pip_installs(base)
    assert installs, "the base stage installs nothing"
    for stage in stage_chain(airflow_image, airflow_image[-1]):
        for words in pip_installs(stage):
            assert "-c" in words and words[words.index("-c") + 1] == "constraints.txt"
            assert not any(re.search(r"(^|[^\w-])torch\b", w) for w in words), words
            extras = [e for w in words for e in re.findall(r"\[([^\]]*)\]", w)]
            assert all("trainer" not in e for e in extras), words
    assert any('".[airflow]"' in words for words in installs)
    # pip may not move the image's Airflow while it installs the rest
    assert any('"apache-airflow==${airflow_version}"' in words for words in installs)
    assert "torch must not be in the Airflow image" in " ".join(base.args("RUN"))


def _requirements_closure(roots: list[Requirement]) -> set[str]:
    """Every distribution the given requirements pull in, read from the installed metadata."""
    names: set[str] = set()
    visited: set[tuple[str, frozenset]] = set()
    pending = list(roots)
    while pending:
        requirement = pending.pop()
        name = canonicalize_name(requirement.name)
        if requirement.marker and not requirement.marker.evaluate({"extra": ""}):
            continue
        key = (name, frozenset(requirement.extras))
        if key in visited:
            continue
        visited.add(key)
        names.add(name)
        try:
            dist_requires = metadata.requires(requirement.name) or []
        except metadata.PackageNotFoundError:
            continue
        for line in dist_requires:
            child = Requirement(line)
            extras = ("", *requirement.extras)
            if not child.marker or any(child.marker.evaluate({"extra": e}) for e in extras):
                child.marker = None
                pending.append(child)
    return names


def test_airflow_extra_does_not_pull_torch_even_transitively():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    roots = [Requirement(r) for r in project["dependencies"] + project["optional-dependencies"]["airflow"]]
    closure = _requirements_closure(roots)
    assert "apache-airflow-providers-cncf-kubernetes" in closure and "great-expectations" in closure
    assert "torch" not in closure, "a dependency of .[airflow] pulls torch into the Airflow image"
    assert "torch" in _requirements_closure(
        [Requirement(r) for r in project["optional-dependencies"]["trainer"]]
    )


def test_dev_stage_adds_the_trainer_with_cpu_torch_at_the_pinned_version(airflow_image):
    dev = _stage(airflow_image, "dev")
    installs = pip_installs(dev)
    torch_install = next(words for words in installs if any(w.startswith('"torch==') for w in words))
    assert torch_install[torch_install.index("--index-url") + 1] == CPU_TORCH_INDEX
    assert "--no-deps" in torch_install  # everything else comes from PyPI, pinned by constraints
    runs = " ".join(dev.args("RUN"))
    assert "s/^torch==//p" in runs and '"torch==${torch_version}"' in torch_install
    assert re.fullmatch(r"\d+\.\d+\.\d+", _constraint("torch"))  # what the sed above extracts
    project = next(words for words in installs if any("[airflow,trainer]" in w for w in words))
    assert "-c" in project and "-e" in project


def test_every_stage_runs_and_installs_as_the_non_root_airflow_user(airflow_image):
    for stage in airflow_image:
        users = [user for s in reversed(stage_chain(airflow_image, stage)) for user in s.args("USER")]
        assert users and users[-1] == "airflow", f"stage {stage.name} ends as {users[-1:]}"
        for index, (op, arg) in enumerate(stage.instructions):
            if op == "RUN" and "pip install" in arg:
                before = [a for o, a in stage.instructions[:index] if o == "USER"]
                inherited = [
                    u for s in reversed(stage_chain(airflow_image, stage)[1:]) for u in s.args("USER")
                ]
                assert (inherited + before)[-1] == "airflow"  # the official image refuses pip as root


def test_no_credentials_or_shell_form_entrypoints():
    for path in (AIRFLOW_DOCKERFILE, TRAINER_DOCKERFILE):
        global_args, stages = parse_dockerfile(path)
        names = list(global_args)
        for stage in stages:
            for op, arg in stage.instructions:
                if op in ("ENV", "ARG"):
                    names += re.findall(r"(\w+)=", arg) or [arg.split()[0]]
                if op in ("CMD", "ENTRYPOINT", "HEALTHCHECK") and arg != "NONE":
                    exec_part = arg.split("CMD", 1)[-1].strip() if op == "HEALTHCHECK" else arg
                    assert exec_part.startswith("["), f"{path.name}: {op} {arg} is not in exec form"
            assert not any(".env" in source for source, _ in copy_sources(stage))
        secret = [n for n in names if re.search(r"SECRET|PASSWORD|TOKEN|ACCESS_KEY|CREDENTIAL", n, re.I)]
        assert not secret, f"{path.name} bakes credential-like settings {secret}"


def test_copy_sources_exist_and_pass_the_dockerignore(airflow_image):
    ignored = dockerignore(AIRFLOW_DOCKERIGNORE)
    copied = set()
    for stage in airflow_image:
        for source, _ in copy_sources(stage):
            assert (REPO / source).exists(), f"airflow.Dockerfile copies {source}, which does not exist"
            files = _files_under(source)
            assert files, f"airflow.Dockerfile copies {source}, which is empty"
            blocked = [f for f in files if ignored(f)]
            assert not blocked, f"the dockerignore keeps {blocked[:3]} of {source} out of the build"
            copied.add(source.rstrip("/"))
    assert {"pyproject.toml", "constraints.txt", "README.md", "trainer", "plugins/trainops", "dags"} <= copied


def test_dockerignore_keeps_local_state_and_secrets_out_of_the_context():
    ignored = dockerignore(AIRFLOW_DOCKERIGNORE)
    for path in (
        ".env",
        "docker/.env",
        "trainer/.env",
        ".venv/bin/python",
        ".git/config",
        ".airflow/airflow.db",
        ".trainops/storage/x.json",
        ".trainops-test/airflow/airflow.db",
        "trainer/__pycache__/train.cpython-311.pyc",
        "trainops.egg-info/PKG-INFO",
        "tests/conftest.py",
        "docker/compose.yaml",
    ):
        assert ignored(path), f"{path} would be sent to the Docker build"
    for path in ("pyproject.toml", "trainer/train.py", "plugins/trainops/links.py", "dags/trainops_demo.py"):
        assert not ignored(path)


@pytest.mark.slow
def test_install_checks_in_the_image_name_importable_modules(airflow_image):
    modules = set()
    for stage in airflow_image:
        for run in stage.args("RUN"):
            for code in re.findall(r'python -c "import ([^";]+)', run):
                modules.update(m.strip() for m in code.split(","))
    assert {"trainops.operators", "trainer.contract", "trainer.train"} <= modules
    result = subprocess.run(
        [sys.executable, "-c", f"import {', '.join(sorted(modules))}"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]


# ----------------------------------------------------------------------------- trainer image


def test_trainer_dockerfile_copy_sources_exist():
    _, stages = parse_dockerfile(TRAINER_DOCKERFILE)
    sources = [source for stage in stages for source, _ in copy_sources(stage)]
    assert "docker/trainer-entrypoint.sh" in sources
    for source in sources:
        assert (REPO / source).exists(), f"trainer.Dockerfile copies {source}, which does not exist"
        assert _files_under(source), f"trainer.Dockerfile copies {source}, which is empty"
    ignored = dockerignore(REPO / "docker" / "trainer.Dockerfile.dockerignore")
    for source in sources:
        blocked = [f for f in _files_under(source) if ignored(f)]
        assert not blocked, f"the trainer dockerignore keeps {blocked[:3]} of {source} out of the build"
    for path in (".env", "docker/.env", ".venv/bin/python", ".git/config", "tests/conftest.py"):
        assert ignored(path), f"{path} would be sent to the trainer image build"


# ----------------------------------------------------------------------------- the trainer's entrypoint

ENTRYPOINT_SCRIPT = REPO / "docker" / "trainer-entrypoint.sh"


def _containers(manifest) -> list[dict]:
    """Every container dict anywhere in a manifest."""
    if isinstance(manifest, dict):
        found = [manifest] if "image" in manifest and "name" in manifest else []
        return found + [c for v in manifest.values() for c in _containers(v)]
    if isinstance(manifest, list):
        return [c for v in manifest for c in _containers(v)]
    return []


@pytest.mark.parametrize("kind", ["indexed-job", "pytorchjob"])
def test_pods_set_command_so_the_images_entrypoint_never_runs_in_them(kind):
    """The decision the image's comments describe: a pod's ``command`` replaces ENTRYPOINT, so a
    comment saying pods pass ``args`` to the entrypoint would be wrong."""
    from trainops.cluster.kubernetes.render import render_manifests
    from trainops.cluster.spec import JobSpec

    spec = JobSpec(name="train-0123abcd-a1", args=["python", "-m", "trainer", "train"], kind=kind, nodes=2)
    containers = [c for m in render_manifests(spec) for c in _containers(m)]
    assert containers and all(c["command"][0] == "python" and "args" not in c for c in containers)
    claims = ("keeps this ENTRYPOINT", "as the container's args", "Pods pass the")
    for path in (ENTRYPOINT_SCRIPT, TRAINER_DOCKERFILE, REPO / "docker" / "README.md"):
        text = " ".join(path.read_text().split())
        assert not [c for c in claims if c in text], f"{path.name} says pods use the entrypoint"
        assert "bypass" in text or "never use it" in text, path.name


@pytest.mark.parametrize(
    ("argv", "runs"),
    [
        (["train", "--config", "c.yaml"], ["-m", "trainer", "train", "--config", "c.yaml"]),
        (
            ["--nproc-per-node=2", "-m", "trainer"],
            ["-m", "torch.distributed.run", "--nproc-per-node=2", "-m", "trainer"],
        ),
        ([], ["-m", "trainer", "--help"]),
    ],
)
def test_the_entrypoint_runs_docker_run_shorthands(argv, runs, tmp_path):
    """``docker run IMAGE train ...`` runs the trainer; the stand-in ``python`` records what ran."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {tmp_path}/ran\n')
    (bin_dir / "python").chmod(0o755)
    cache = tmp_path / "cache" / "trainops"
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "TRAINOPS_CACHE_DIR": str(cache)}
    subprocess.run(["sh", str(ENTRYPOINT_SCRIPT), *argv], env=env, check=True, timeout=30)
    assert (tmp_path / "ran").read_text().splitlines() == runs
    assert cache.is_dir()


def test_the_trainer_creates_its_cache_dir_without_the_entrypoint(tmp_path, monkeypatch):
    """Pods skip the entrypoint's mkdir; the trainer makes the folder itself."""
    from trainer.data import cache_dir

    monkeypatch.setenv("TRAINOPS_CACHE_DIR", str(tmp_path / "not" / "there"))
    assert cache_dir() == tmp_path / "not" / "there" and cache_dir().is_dir()
