"""The Airflow plugin: where the report app is served, and what loading the plugin costs."""

import json
import os
import subprocess
import sys


def test_plugin_serves_the_app_at_trainops_and_stays_cheap_to_import():
    from trainops.plugin import TrainopsPlugin

    assert [(a["url_prefix"], a["name"]) for a in TrainopsPlugin.fastapi_apps] == [
        ("/trainops", "trainops reports")
    ]
    probe = (
        "import sys, trainops.plugin; "
        "print(sorted(m for m in ('fastapi', 'trainops.reports.app', 'boto3', 'pyarrow') "
        "if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, env=os.environ.copy()
    )
    assert json.loads(out.stdout.strip().splitlines()[-1].replace("'", '"')) == []


def test_an_installed_trainops_publishes_the_plugin_by_entry_point():
    """pip-installed, the entry point registers the plugin; plugins/trainops_plugin.py then
    stands back (a second registration is an import error in Airflow)."""
    from trainops.plugin import registered_by_entry_point

    assert registered_by_entry_point() is True
