"""The contract package is one import for the Airflow side: every public name its parts define is
a name of ``trainer.contract`` (the parts themselves are tested in tests/trainer/contract/)."""

import ast
import importlib
import inspect
import pkgutil

import trainer.contract


def defined_names(module) -> set[str]:
    """The public names ``module``'s source defines at its top level (not those it imports)."""
    names = set()
    for node in ast.parse(inspect.getsource(module)).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return {n for n in names if not n.startswith("_")}


def test_every_public_name_of_every_part_is_a_name_of_the_contract():
    parts = [m.name for m in pkgutil.iter_modules(trainer.contract.__path__)]
    assert parts == ["heartbeat", "launch", "layout", "metrics", "records", "tasks"]
    lost = {}
    for part in parts:
        module = importlib.import_module(f"trainer.contract.{part}")
        names = defined_names(module)
        assert names, part
        missing = sorted(
            n
            for n in names
            if getattr(trainer.contract, n, None) is not getattr(module, n)
            or n not in trainer.contract.__all__
        )
        if missing:
            lost[part] = missing
    assert lost == {}
    assert len(trainer.contract.__all__) == len(set(trainer.contract.__all__))
    assert all(hasattr(trainer.contract, name) for name in trainer.contract.__all__)
