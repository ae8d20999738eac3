"""The two halves meet only in the shared trainer modules (``trainer.contract.SHARED_MODULES``):
the Airflow side never imports torch or any other trainer module, the trainer never imports
Airflow or trainops. Checked on the source (every import, functions included) and in a fresh
interpreter that imports the whole Airflow side."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.test_layout import REPO, imports_of, project_modules
from trainer.contract import SHARED_MODULES


def _shared(module: str) -> bool:
    """A shared module, or a submodule of one (``trainer.contract.metrics``, ``trainer.storage.s3``):
    the shared set means the packages whole; any other trainer module is not."""
    return module == "trainer" or any(module == m or module.startswith(f"{m}.") for m in SHARED_MODULES)


def _external_imports(path) -> set[str]:
    """Top-level names of every module ``path`` imports (functions included)."""
    import ast

    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


def test_the_airflow_side_imports_only_the_shared_trainer_modules():
    modules = project_modules()
    crossing = {
        name: sorted(m for m in imports_of(name, path, modules) if m.startswith("trainer") and not _shared(m))
        for name, path in modules.items()
        if name.startswith("trainops")
    }
    assert {k: v for k, v in crossing.items() if v} == {}
    dag_imports = {
        p.name: sorted(
            m for m in imports_of("dags", p, modules) if m.startswith("trainer") and not _shared(m)
        )
        for p in (REPO / "dags").glob("*.py")
    }
    assert {k: v for k, v in dag_imports.items() if v} == {}


def test_the_airflow_side_never_imports_torch_and_the_trainer_never_imports_airflow():
    modules = project_modules()
    airflow_side = [p for n, p in modules.items() if n.startswith("trainops")] + list(
        (REPO / "dags").glob("*.py")
    )
    assert [str(p.relative_to(REPO)) for p in airflow_side if "torch" in _external_imports(p)] == []
    trainer_side = [p for n, p in modules.items() if n.startswith("trainer")]
    leaks = {
        str(p.relative_to(REPO)): sorted(_external_imports(p) & {"airflow", "trainops"}) for p in trainer_side
    }
    assert {k: v for k, v in leaks.items() if v} == {}


def test_the_shared_modules_are_themselves_free_of_torch_and_airflow():
    modules = project_modules()
    for name, path in modules.items():
        if _shared(name):
            assert not _external_imports(path) & {"torch", "numpy", "airflow", "trainops"}, name
            inner = {m for m in imports_of(name, path, modules) if m.startswith("trainer")}
            assert all(_shared(m) for m in inner), (name, inner)


PROBE = """
import importlib, json, pkgutil, sys
import trainops
names = [m.name for m in pkgutil.walk_packages(trainops.__path__, "trainops.")
         if m.name not in ("trainops.__main__",)]
for name in names:
    importlib.import_module(name)
print(json.dumps({"imported": len(names),
                  "trainer": sorted(m for m in sys.modules if m == "trainer" or m.startswith("trainer.")),
                  "torch": "torch" in sys.modules}))
"""


def test_importing_every_module_of_the_airflow_side_loads_no_torch_and_no_other_trainer_module():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, cwd=REPO)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["imported"] > 50
    assert result["torch"] is False
    assert [m for m in result["trainer"] if not _shared(m)] == []
