"""``python -m trainops doctor``: is this cluster and storage ready for a first run?

Read-only and fast: each check reads what the cluster and the storage root say, and a pure
function (:mod:`trainops.doctor.checks`) turns that into one line, pass or fail with the fix.
The gathering is at the edges: :mod:`.cluster` (the Kubernetes API), :mod:`.storage` (a
probe under the storage root, deleted again), :mod:`.airflow_api` (the connection notes use);
:mod:`trainops.cli.doctor` prints the table.
"""
