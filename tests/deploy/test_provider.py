"""Provider metadata: what `airflow providers ...` shows for trainops, and that every class
path it lists is real."""

from __future__ import annotations

import importlib
import inspect
import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import airflow
import pytest
from airflow.sdk import BaseOperator, BaseOperatorLink

from trainops.provider import get_provider_info

SCHEMA = Path(airflow.__file__).parent / "provider_info.schema.json"


def providers_cli(*args: str):
    """``airflow providers <args> --output json`` in a subprocess with the test environment."""
    result = subprocess.run(
        [sys.executable, "-m", "airflow", "providers", *args, "--output", "json"],
        capture_output=True,
        text=True,
        env=os.environ.copy(),
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def info():
    return get_provider_info()


def test_provider_info_is_valid_and_uses_only_keys_airflow_knows(info):
    import jsonschema

    schema = json.loads(SCHEMA.read_text())
    jsonschema.validate(info, schema)
    # the schema allows unknown keys, so a misspelt one ("extra_links") would pass validation
    unknown = set(info) - set(schema["properties"]) - {"versions"}
    assert not unknown, f"keys Airflow ignores: {sorted(unknown)}"
    assert info["versions"] == [metadata.version("trainops")]


def test_no_connection_type_hook_or_plugin_is_declared(info):
    # trainops uses Airflow's `aws` and `kubernetes` connections; the plugin comes from the
    # airflow.plugins entry point, and listing it here would register it twice
    for key in ("connection-types", "hook-class-names", "hooks", "plugins"):
        assert key not in info


def test_extra_links_are_the_operator_link_classes_trainops_defines(info):
    import trainops.links

    listed = info["extra-links"]
    for path in listed:
        module, _, name = path.rpartition(".")
        cls = getattr(importlib.import_module(module), name)
        assert inspect.isclass(cls) and issubclass(cls, BaseOperatorLink), path
    defined = {
        f"trainops.links.{name}"
        for name, cls in vars(trainops.links).items()
        if inspect.isclass(cls)
        and issubclass(cls, trainops.links.StoredReportLink)
        and cls is not trainops.links.StoredReportLink
    }
    assert set(listed) == defined, "list every report link in provider.py's extra-links"
    assert len(listed) == len(set(listed))


def test_every_link_an_operator_offers_is_listed(info):
    import trainops.operators

    offered = {
        f"{type(link).__module__}.{type(link).__qualname__}"
        for name in trainops.operators.__all__
        for link in getattr(trainops.operators, name).operator_extra_links
    }
    assert offered and offered <= set(info["extra-links"])


def test_operator_modules_hold_every_public_operator(info):
    import trainops.operators

    modules = [m for group in info["operators"] for m in group["python-modules"]]
    defined = set()
    for module_name in modules:
        module = importlib.import_module(module_name)
        operators = [
            cls
            for cls in vars(module).values()
            if inspect.isclass(cls) and issubclass(cls, BaseOperator) and cls.__module__ == module_name
        ]
        assert operators, f"{module_name} defines no operator"
        defined.update(cls.__name__ for cls in operators)
    assert set(trainops.operators.__all__) <= defined
    assert "trainops.operators.rollback" in modules
    for group in info["triggers"]:
        for module_name in group["python-modules"]:
            importlib.import_module(module_name)
    integrations = {i["integration-name"] for i in info["integrations"]}
    assert {g["integration-name"] for g in info["operators"] + info["triggers"]} <= integrations


@pytest.mark.slow
def test_airflow_lists_trainops_with_its_version(info):
    providers = {p["package_name"]: p for p in providers_cli("list")}
    assert "trainops" in providers, sorted(providers)
    assert providers["trainops"]["version"] == info["versions"][0] == metadata.version("trainops")


@pytest.mark.slow
def test_airflow_lists_trainops_extra_links(info):
    links = {row["extra_link_class_name"] for row in providers_cli("links")}
    ours = {link for link in links if link.startswith("trainops.")}
    # Airflow imports each class before listing it, so a wrong path would be missing here
    assert ours == set(info["extra-links"])


@pytest.mark.slow
def test_airflow_registers_no_connection_type_for_trainops():
    hooks = providers_cli("hooks")
    assert not [h for h in hooks if h.get("package_name") == "trainops"]
    kubernetes = [h for h in hooks if h["connection_type"] == "kubernetes"]
    assert kubernetes and kubernetes[0]["package_name"] == "apache-airflow-providers-cncf-kubernetes"
