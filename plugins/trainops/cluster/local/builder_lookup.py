"""Find a ``model.builder`` or an ``eval.metrics`` scorer (``module:function``) on this host
without importing it.

The Airflow side never imports torch, and a builder module usually does, so nothing is
imported: the top-level name is located with ``importlib.util.find_spec`` (which imports
nothing for a top-level name), each submodule with ``PathFinder`` inside its parent's folders
(so no parent package runs either), and the module's source is parsed, not run: the function
must be defined, assigned or imported at its top level. A module whose names cannot be known
without running it (``from x import *``, a module-level ``__getattr__``, a compiled
extension) passes.

For the local cluster the lookup runs in a child interpreter with the environment and working
folder the cluster gives its processes (this file, run by its path; see :func:`local_problem`):
a module the worker finds only through a folder Airflow adds to its own ``sys.path`` (the DAGs
folder, the plugins folder) is not one the trainer finds.
"""

from __future__ import annotations

import ast
import importlib.machinery
import importlib.util
import json
import logging
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from importlib.machinery import ModuleSpec

from trainops.cluster.local.backend import _env_with_package_path

LOOKUP_TIMEOUT_S = 60.0
# The child runs this file by its path, not ``-m trainops...``: its sys.path must be exactly
# the trainer's (the job's PYTHONPATH, the working folder), with nothing added to find us.
_BOOTSTRAP = (
    "import importlib.util, sys\n"
    "spec = importlib.util.spec_from_file_location('_trainops_builder_lookup', sys.argv[1])\n"
    "module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)\n"
    "spec.loader.exec_module(module)\n"
    "sys.exit(module.main(sys.argv[2:]))\n"
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Lookup:
    """Where a builder's module is on this host, and what is wrong with it.

    :param found: the module's source (or package) was found on this Python path.
    :param origin: its file, when it has one.
    :param problem: why the trainer could not call the builder (None: nothing found wrong).
    """

    found: bool
    origin: str | None = None
    problem: str | None = None


def find_builder(module: str, function: str, key: str = "model.builder") -> Lookup:
    """Look ``module:function`` up on this interpreter's path (see the module docstring);
    ``key``: the config key that names it, for messages."""
    builder = f"{module}:{function}"
    parts = module.split(".")
    spec = _top_level_spec(parts[0])
    for depth in range(1, len(parts)):
        if spec is None:
            break
        parent, name = ".".join(parts[:depth]), ".".join(parts[: depth + 1])
        if name in sys.modules:  # imported already (os.path): nothing runs by asking it
            spec = getattr(sys.modules[name], "__spec__", None)
            if spec is None:
                return Lookup(True)
            continue
        folders = spec.submodule_search_locations
        if folders is None:
            return Lookup(
                True,
                spec.origin,
                f"{key} {builder!r}: {parent!r} ({spec.origin}) is a module, not a package, so it "
                f"has no submodule {parts[depth]!r}; check the module path",
            )
        spec = importlib.machinery.PathFinder.find_spec(name, list(folders))
        if spec is None:
            return Lookup(
                True,
                None,
                f"{key} {builder!r}: package {parent!r} ({', '.join(folders)}) has no module "
                f"{parts[depth]!r}; check the module path",
            )
    if spec is None:
        return Lookup(False)
    origin = spec.origin if spec.has_location else None
    if origin is None or not origin.endswith(".py"):
        return Lookup(True, origin)  # a namespace package, an extension, a built-in: not readable
    return Lookup(True, origin, _source_problem(f"{key} {builder!r}", module, function, origin))


def _top_level_spec(name: str) -> ModuleSpec | None:
    try:
        return importlib.util.find_spec(name)
    except (ImportError, ValueError):  # ValueError: a module in sys.modules without a spec
        return None


def _source_problem(named: str, module: str, function: str, origin: str) -> str | None:
    try:
        with open(origin, "rb") as f:
            tree = ast.parse(f.read(), filename=origin)
    except SyntaxError as exc:
        return f"{named}: {origin} is not valid Python ({exc.msg}, line {exc.lineno}); fix it"
    except OSError:
        return None
    names = top_level_names(tree)
    if names is None or function in names:
        return None
    return (
        f"{named}: module {module!r} ({origin}) has no function {function!r}; "
        "name a function it defines at its top level"
    )


def top_level_names(tree: ast.Module) -> set[str] | None:
    """The names a module binds at its top level (in ``if``/``try``/``with`` blocks too), or
    None when they cannot be known without running it (``import *``, ``__getattr__``)."""
    names: set[str] = set()
    dynamic = False

    def visit(body: list[ast.stmt]) -> None:
        nonlocal dynamic
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
                dynamic = dynamic or node.name == "__getattr__"
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
            elif isinstance(node, ast.Import):
                names.update(a.asname or a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                dynamic = dynamic or any(a.name == "*" for a in node.names)
                names.update(a.asname or a.name for a in node.names)
            else:
                for block in ("body", "orelse", "finalbody"):
                    visit(getattr(node, block, None) or [])
                for handler in getattr(node, "handlers", None) or []:
                    visit(handler.body)

    visit(tree.body)
    return None if dynamic else names


def local_problem(
    builder: str, job_env: Mapping[str, str] | None = None, key: str = "model.builder"
) -> str | None:
    """Why the local cluster's trainer could not call ``builder`` (``module:function``), or
    None: looked up in a child interpreter with the environment the cluster gives its processes
    (this one's, the packages' paths, and the job's own ``job_env``) and an empty working
    folder, as they start. A lookup that itself fails is logged and passes: the trainer still
    names the problem when it starts."""
    env = {**_env_with_package_path(), **(job_env or {})}
    with tempfile.TemporaryDirectory(prefix="trainops-builder-") as cwd:
        try:
            done = subprocess.run(
                [sys.executable, "-c", _BOOTSTRAP, __file__, builder, key],
                env=env,
                cwd=cwd,
                capture_output=True,
                text=True,
                timeout=LOOKUP_TIMEOUT_S,
                check=False,
            )
            found = Lookup(**json.loads(done.stdout.strip().splitlines()[-1]))
        except (OSError, subprocess.TimeoutExpired, ValueError, IndexError, TypeError) as exc:
            log.warning("could not look up %s %r for the local cluster: %s", key, builder, exc)
            return None
    if found.problem or found.found:
        return found.problem
    module = builder.partition(":")[0]
    return (
        f"{key} {builder!r}: no module {module!r} on the local cluster's Python path "
        f"(PYTHONPATH={env.get('PYTHONPATH', '')!r} and the installed packages); put its folder on "
        "PYTHONPATH or install it where Airflow runs"
    )


def main(argv: list[str]) -> int:
    """``python builder_lookup.py MODULE:FUNCTION [KEY]``: the :class:`Lookup`, as one JSON line."""
    module, _, function = argv[0].partition(":")
    print(json.dumps(asdict(find_builder(module, function, *argv[1:2]))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
