"""The plugins folder loads the way Airflow loads it, without import errors or shadowing."""

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_plugins_folder_scan_imports_only_the_plugin_file():
    from airflow._shared.plugins_manager.plugins_manager import _load_plugins_from_plugin_directory

    sys.modules.pop("trainops_plugin", None)
    before = set(sys.modules)
    _, errors = _load_plugins_from_plugin_directory(
        plugins_folder=str(REPO / "plugins"), ignore_file_syntax="glob"
    )
    assert errors == {}
    new_top_level = {m for m in set(sys.modules) - before if "." not in m}
    assert "trainops_plugin" in new_top_level
    # .airflowignore keeps plugins/trainops/cluster/local/backend.py and friends from becoming
    # top-level modules named "local", "spec", ... (or shadowing "kubernetes")
    package_files = {p.stem for p in (REPO / "plugins" / "trainops").rglob("*.py")}
    assert not (new_top_level & package_files)


def test_airflow_registers_trainops_once_without_import_errors():
    from airflow import plugins_manager

    plugins, errors = plugins_manager._get_plugins()
    assert [p.name for p in plugins].count("trainops") == 1
    assert errors == {}


def test_provider_info_is_valid_against_airflow_schema():
    import json

    import airflow
    import jsonschema

    from trainops.provider import get_provider_info

    schema = json.loads((Path(airflow.__file__).parent / "provider_info.schema.json").read_text())
    jsonschema.validate(get_provider_info(), schema)
