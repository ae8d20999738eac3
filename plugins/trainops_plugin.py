"""trainops' Airflow plugin, for deployments that use this plugins folder.

Airflow imports every ``.py`` here as a top-level module, so the package itself sits behind
``.airflowignore`` and is imported normally (the plugins folder is on ``sys.path``). When
trainops is also pip-installed, its ``airflow.plugins`` entry point registers the same plugin,
and Airflow would report a second registration under one name as an import error; so this
file registers the plugin only when no entry point does.
"""

from trainops.plugin import registered_by_entry_point

if not registered_by_entry_point():
    from trainops.plugin import TrainopsPlugin  # noqa: F401  (found by Airflow's plugin scan)
