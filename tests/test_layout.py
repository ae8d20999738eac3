"""The layout's rules, checked on the source: no import cycles (imports inside functions count),
the Airflow side touches only the shared trainer modules, a short top level, and every package
shipped.

Run as a script (``python tests/test_layout.py [ROOT]``) it prints the counts for a tree.
"""

from __future__ import annotations

import ast
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = {"trainops": Path("plugins") / "trainops", "trainer": Path("trainer")}


def project_modules(root: Path = REPO) -> dict[str, Path]:
    """Every module of the two packages: dotted name -> file."""
    out = {}
    for package, base in PACKAGES.items():
        for path in sorted((root / base).rglob("*.py")):
            rel = path.relative_to(root / base).with_suffix("")
            parts = [package, *rel.parts]
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules ``name`` imports anywhere in its file: inside functions and under
    ``if TYPE_CHECKING:`` too (a cycle that only type checkers follow is still two modules that
    each need the other)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def resolve(target: str) -> str | None:
        while target and target not in modules:
            target = target.rpartition(".")[0]
        return target or None

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names
            ]
        else:
            continue
        for target in targets:
            module = resolve(target)
            if module and module != name:
                found.add(module)
    return found


def import_graph(root: Path = REPO) -> dict[str, set[str]]:
    modules = project_modules(root)
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def top_level_modules(root: Path = REPO) -> list[str]:
    return sorted(p.name for p in (root / PACKAGES["trainops"]).glob("*.py"))


def trainer_top_level(root: Path = REPO) -> list[str]:
    """The trainer's modules and packages at its top level (its rooms: checkpoint/, export/, ...)."""
    base = root / PACKAGES["trainer"]
    return sorted(
        p.name for p in base.iterdir() if p.suffix == ".py" or (p.is_dir() and (p / "__init__.py").exists())
    )


# ----------------------------------------------------------------------------- the rules
MAX_TOP_LEVEL_MODULES = 8
MAX_TRAINER_TOP_LEVEL = 20
# The training operator keeps the Airflow work only; the recovery loop lives in recovery/.
OPERATOR_FILE = Path("plugins") / "trainops" / "operators" / "train.py"
MAX_OPERATOR_LINES = 450


def test_no_import_cycles_among_our_modules_counting_imports_inside_functions():
    assert cycles(import_graph()) == []


# Layers that must not import upwards: (importer, imported) as package prefixes. An operator
# does not depend on the example DAGs' recipes, and the cluster backends report what the cluster
# says without knowing how recovery reads it.
FORBIDDEN_DIRECTIONS = [
    ("trainops.operators", "trainops.recipes"),
    ("trainops.cluster", "trainops.recovery"),
]


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def wrong_way_imports(
    graph: dict[str, set[str]], forbidden: list[tuple[str, str]] = FORBIDDEN_DIRECTIONS
) -> list[tuple[str, str]]:
    """Every (importer, imported) pair of ``graph`` that goes a forbidden direction."""
    return sorted(
        (name, target)
        for name, targets in graph.items()
        for target in targets
        for low, high in forbidden
        if _within(name, low) and _within(target, high)
    )


def test_no_layer_imports_a_layer_above_it():
    assert wrong_way_imports(import_graph()) == []


def test_a_wrong_way_import_is_found_wherever_it_sits(tmp_path):
    """The check reads imports inside functions and under TYPE_CHECKING alike."""
    base = tmp_path / "plugins" / "trainops"
    for package in ("operators", "recipes", "cluster", "recovery"):
        (base / package).mkdir(parents=True)
        (base / package / "__init__.py").write_text("")
    (tmp_path / "trainer").mkdir()
    (base / "__init__.py").write_text("")
    (base / "recipes" / "form.py").write_text("class SettingsError(ValueError): ...\n")
    (base / "recovery" / "classify.py").write_text("EVICTED = 'Evicted'\n")
    (base / "operators" / "fail_fast.py").write_text(
        "def f():\n    from trainops.recipes.form import SettingsError\n"
    )
    (base / "cluster" / "state.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..recovery.classify import EVICTED\n"
    )
    assert wrong_way_imports(import_graph(tmp_path)) == [
        ("trainops.cluster.state", "trainops.recovery.classify"),
        ("trainops.operators.fail_fast", "trainops.recipes.form"),
    ]


def test_an_import_under_type_checking_counts_for_cycles(tmp_path):
    base = tmp_path / "plugins" / "trainops"
    base.mkdir(parents=True)
    (tmp_path / "trainer").mkdir()
    (base / "__init__.py").write_text("")
    (base / "a.py").write_text("from trainops.b import B\nclass A: ...\n")
    (base / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from trainops.a import A\nclass B: ...\n"
    )
    assert cycles(import_graph(tmp_path)) == [["trainops.a", "trainops.b"]]


def test_the_airflow_side_keeps_a_short_top_level():
    top = top_level_modules()
    assert len(top) <= MAX_TOP_LEVEL_MODULES, top


def test_the_trainer_keeps_a_short_top_level():
    top = trainer_top_level()
    assert len(top) <= MAX_TRAINER_TOP_LEVEL, top


def test_the_training_operator_stays_airflow_glue():
    lines = len((REPO / OPERATOR_FILE).read_text().splitlines())
    assert lines <= MAX_OPERATOR_LINES, (
        f"{OPERATOR_FILE} has {lines} lines (at most {MAX_OPERATOR_LINES}): move decisions to "
        "trainops.recovery and launching or job.json I/O to operators/train_*.py"
    )


def test_every_package_is_shipped():
    """A package missing from pyproject's list installs without it (the images use pip)."""
    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    on_disk = {name for name, path in project_modules().items() if path.name == "__init__.py"}
    assert listed == on_disk


# Modules whose tests live in a file not named after them, and what that file must mention.
TESTED_ELSEWHERE = {
    "trainops.__main__": ("tests/trainops/cli/test_main.py", '"-m", "trainops"'),
    "trainops.provider": ("tests/deploy/test_provider.py", "trainops.provider"),
    "trainops.gate.errors": ("tests/trainops/gate/test_checks.py", "GateConfigError"),
    "trainer.__main__": ("tests/trainer/test_cli.py", '"-m", "trainer"'),
    "trainer.config.errors": ("tests/trainer/test_config.py", "ConfigError"),
}


def expected_test_file(module: str) -> Path:
    """``trainops.a.b`` -> ``tests/trainops/a/test_b.py``; ``trainer.x`` -> ``tests/trainer/test_x.py``."""
    package, _, leaf = module.rpartition(".")
    return REPO / "tests" / Path(*package.split(".")) / f"test_{leaf}.py"


def test_every_module_has_a_test_file_named_after_it():
    """Tests mirror the layout, so the tests of a module are where a reader looks for them.
    A few modules are tested where their behaviour is (``TESTED_ELSEWHERE`` says where)."""
    missing = []
    for name, path in project_modules().items():
        if path.name == "__init__.py":
            continue
        if name in TESTED_ELSEWHERE:
            where, mention = TESTED_ELSEWHERE[name]
            assert mention in (REPO / where).read_text(), (name, where)
            continue
        expected = expected_test_file(name)
        if not expected.exists():
            missing.append(str(expected.relative_to(REPO)))
    assert missing == []


# Test files named after a behaviour that spans modules, not after one module.
BEHAVIOUR_TESTS = {
    "tests/trainops/cluster/kubernetes/test_manifests.py": "every kind and option against the real schemas",
    "tests/trainops/operators/test_stage_job.py": "StageDatasetOperator staging as a cluster job",
    "tests/trainops/operators/test_train_k8s_scenarios.py": "operator, triggers and backend on a fake API",
    "tests/trainops/staging/test_bad_inputs.py": "every bad input users meet, end to end",
    "tests/trainops/test_damaged_records.py": "damaged records through every report page and command",
    "tests/trainops/staging/spark/test_connect.py": "staging from a worker through a Spark Connect server",
    "tests/trainer/test_gradients.py": "each precision's gradients against a one-process reference",
    "tests/trainer/models/test_hf_training.py": "a Hugging Face model through the whole trainer under torchrun",
    "tests/trainer/models/test_hf_classifier.py": "a Hugging Face classifier through the whole trainer under torchrun",
    "tests/trainer/models/test_hf_encoders.py": "Hugging Face encoder classifiers from a config",
    "tests/trainer/test_resume.py": "bitwise and elastic resume under torchrun",
    "tests/trainer/test_s3_run.py": "a run with its prefix on S3",
}


def test_every_test_file_named_after_a_module_has_that_module():
    """A test file left behind by a rename or a deletion would mirror nothing; the files named
    after a behaviour are listed in ``BEHAVIOUR_TESTS``."""
    modules = set(project_modules())
    for listed in BEHAVIOUR_TESTS:
        assert (REPO / listed).exists(), listed
    orphans = []
    for base in ("trainops", "trainer"):
        for test in sorted((REPO / "tests" / base).rglob("test_*.py")):
            rel = test.relative_to(REPO / "tests").with_suffix("")
            module = ".".join([*rel.parts[:-1], rel.parts[-1].removeprefix("test_")])
            listed = str(test.relative_to(REPO)) in BEHAVIOUR_TESTS
            if module not in modules and not listed:
                orphans.append(str(test.relative_to(REPO)))
    assert orphans == []


if __name__ == "__main__":
    root = Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else REPO
    found = cycles(import_graph(root))
    print(f"top_level_modules={len(top_level_modules(root))}")
    print(f"trainer_top_level={len(trainer_top_level(root))}")
    print(f"import_cycles={len(found)}")
    for component in found:
        print("  cycle:", " <-> ".join(component))
    wrong = wrong_way_imports(import_graph(root))
    print(f"wrong_way_imports={len(wrong)}")
    for importer, imported in wrong:
        print(f"  {importer} -> {imported}")
