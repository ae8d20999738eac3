"""Finding a model builder on this host without importing it (its module imports torch)."""

import sys

import pytest

from trainops.cluster.local.builder_lookup import Lookup, find_builder, local_problem, top_level_names


@pytest.fixture
def models(tmp_path, monkeypatch):
    """A folder on this process's sys.path (not on PYTHONPATH) holding a package of models."""
    root = tmp_path / "models"
    (root / "zoo").mkdir(parents=True)
    (root / "zoo" / "__init__.py").write_text("raise RuntimeError('importing the package runs it')\n")
    (root / "zoo" / "gpt.py").write_text(
        "import torch\n\ntry:\n    from fast import build_fast\nexcept ImportError:\n    build_fast = None\n\n"
        "def build(vocab_size, seq_len):\n    return torch.nn.Linear(1, 1), []\n"
    )
    (root / "zoo" / "broken.py").write_text("def build(:\n")
    (root / "flat.py").write_text("def build(vocab_size, seq_len): ...\n")
    monkeypatch.syspath_prepend(str(root))
    return root


def test_a_builder_is_found_without_running_its_package_or_module(models):
    assert find_builder("zoo.gpt", "build") == Lookup(True, str(models / "zoo" / "gpt.py"))
    assert find_builder("zoo.gpt", "build_fast").problem is None  # bound in a try block
    assert "zoo" not in sys.modules and "zoo.gpt" not in sys.modules  # neither ran (zoo raises if it does)


@pytest.mark.parametrize(
    "module, function, problem",
    [
        (
            "zoo.gpt",
            "nope",
            "module 'zoo.gpt' ({gpt}) has no function 'nope'; name a function it defines at its top level",
        ),
        ("zoo.bert", "build", "package 'zoo' ({zoo}) has no module 'bert'; check the module path"),
        (
            "flat.sub",
            "build",
            "'flat' ({flat}) is a module, not a package, so it has no submodule 'sub'; check the module path",
        ),
        ("zoo.broken", "build", "{broken} is not valid Python (invalid syntax, line 1); fix it"),
    ],
)
def test_what_is_wrong_with_a_builder_found_here_is_named(models, module, function, problem):
    paths = {
        "gpt": models / "zoo" / "gpt.py",
        "zoo": models / "zoo",
        "flat": models / "flat.py",
        "broken": models / "zoo" / "broken.py",
    }
    found = find_builder(module, function)
    assert found.found
    assert found.problem == f"model.builder '{module}:{function}': " + problem.format(**paths)


def test_a_builder_not_on_this_host_is_not_found():
    assert find_builder("no_such_models.gpt", "build") == Lookup(False)


def test_names_that_only_running_the_module_gives_pass():
    import ast

    assert top_level_names(ast.parse("from models import *\n")) is None
    assert top_level_names(ast.parse("def __getattr__(name): ...\n")) is None
    assert top_level_names(ast.parse("import a.b as c, d.e\nx: int = 1\nif 1:\n    class K: ...\n")) == {
        "c",
        "d",
        "x",
        "K",
    }


def test_the_local_cluster_looks_where_its_processes_will(models, monkeypatch):
    """On this process's sys.path only (as the DAGs folder is for Airflow): not for the local
    cluster. On PYTHONPATH: found, and checked."""
    assert "no module 'flat' on the local cluster's Python path" in local_problem("flat:build")
    monkeypatch.setenv("PYTHONPATH", str(models))
    assert local_problem("flat:build") is None
    assert local_problem("flat:make") == (
        f"model.builder 'flat:make': module 'flat' ({models / 'flat.py'}) has no function 'make'; "
        "name a function it defines at its top level"
    )
