"""The backend Protocol: both backends have every method it declares, with the same parameters
(checked here at run time, and by mypy on this file), and the cap every ``log_lines`` applies."""

import inspect
import typing
from pathlib import Path

import pytest

from trainops.cluster import get_cluster
from trainops.cluster.base import FINAL_PHASES, ClusterBackend, Phase, cap_lines
from trainops.cluster.kubernetes.backend import KubernetesCluster
from trainops.cluster.local.backend import LocalCluster

REPO = Path(__file__).resolve().parents[3]
BACKENDS = [LocalCluster, KubernetesCluster]
METHODS = sorted(
    name for name, value in vars(ClusterBackend).items() if callable(value) and not name.startswith("_")
)


def typed_backends(state_dir: Path) -> list[ClusterBackend]:
    """What mypy verifies (test_mypy_holds_both_backends_to_the_protocol): each backend is a
    ClusterBackend; a method missing or with another signature is a type error here."""
    local: ClusterBackend = LocalCluster(state_dir)
    kubernetes: ClusterBackend = KubernetesCluster(hook=object())
    return [local, kubernetes]


def test_the_protocol_declares_what_operators_and_triggers_call():
    assert METHODS == ["all_gone", "delete", "find", "launch", "log_lines", "logs_tail", "status"]
    assert "name" in ClusterBackend.__annotations__


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.__name__)
@pytest.mark.parametrize("method", METHODS)
def test_every_backend_has_every_method_with_the_protocols_parameters(backend, method):
    def shape(function):
        return [(p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values()]

    assert shape(getattr(backend, method)) == shape(getattr(ClusterBackend, method))


def test_get_cluster_returns_each_backend_by_name(tmp_path):
    assert [b.name for b in typed_backends(tmp_path)] == ["local", "kubernetes"]
    assert isinstance(get_cluster("local", state_dir=tmp_path), LocalCluster)
    assert isinstance(get_cluster("kubernetes", hook=object()), KubernetesCluster)
    with pytest.raises(ValueError, match=r"unknown cluster 'slurm': use one of \('local', 'kubernetes'\)"):
        get_cluster("slurm")


BROKEN = """
from trainops.cluster.base import ClusterBackend


class NoLogLines:
    name = "no-log-lines"

    def launch(self, spec, *, chaos=None): ...
    def status(self, handle): ...
    def delete(self, handle): ...
    def all_gone(self, handle): ...
    def find(self, labels): ...
    def logs_tail(self, handle, lines=30): ...


class FindsNames(NoLogLines):
    def find(self, labels) -> list[str]:
        return ["job-1"]

    def log_lines(self, handle, cursor, max_lines=200): ...


missing: ClusterBackend = NoLogLines()
wrong: ClusterBackend = FindsNames()
"""


def mypy(monkeypatch, *files: Path) -> tuple[str, int]:
    """mypy with the project's settings over ``files`` and the cluster package; imports of
    anything else count as ``Any`` (fast, and this check is about the Protocol only)."""
    api = pytest.importorskip("mypy.api")
    monkeypatch.chdir(REPO)
    package = sorted(str(p) for p in (REPO / "plugins" / "trainops" / "cluster").rglob("*.py"))
    out, err, status = api.run(
        [
            "--config-file=pyproject.toml",
            "--follow-imports=skip",
            "--no-incremental",
            "--cache-dir=/dev/null",
            *package,
            *(str(f) for f in files),
        ]
    )
    return out + err, status


def test_mypy_holds_both_backends_to_the_protocol(tmp_path, monkeypatch):
    out, status = mypy(monkeypatch, Path(__file__))
    assert status == 0, out
    (tmp_path / "broken_backend.py").write_text(BROKEN)
    out, status = mypy(monkeypatch, tmp_path / "broken_backend.py")
    assert status == 1
    errors = [line.split(": error: ")[1] for line in out.splitlines() if ": error: " in line]
    assert errors == [
        'Incompatible types in assignment (expression has type "NoLogLines", variable has type '
        '"ClusterBackend")  [assignment]',
        'Incompatible types in assignment (expression has type "FindsNames", variable has type '
        '"ClusterBackend")  [assignment]',
    ]
    assert 'missing following "ClusterBackend" protocol member' in out and "note:     log_lines" in out
    assert "def find(self, labels: Mapping[str, str]) -> list[JobHandle]" in out  # what was expected


def test_final_phases_are_phases():
    assert set(FINAL_PHASES) < set(typing.get_args(Phase))
    assert "running" not in FINAL_PHASES and "lost" in FINAL_PHASES


@pytest.mark.parametrize(
    "newest, max_lines, total, expected",
    [
        (["a", "b"], 2, 2, ["a", "b"]),
        (["a", "b", "c"], 2, 3, ["(… 2 earlier lines skipped)", "c"]),
        (["b", "c"], 3, 1234, ["(… 1232 earlier lines skipped)", "b", "c"]),
        (["a", "b", "c"], 1, 3, ["(… 3 earlier lines skipped)"]),
        (["a", "b", "c"], 3, None, ["(… earlier lines skipped)", "b", "c"]),
    ],
)
def test_cap_lines(newest, max_lines, total, expected):
    assert cap_lines(newest, max_lines, total) == expected
    assert len(cap_lines(newest, max_lines, total)) <= max_lines
