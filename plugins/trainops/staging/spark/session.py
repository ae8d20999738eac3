"""Where the Spark engine runs: a pure decision, then the SparkSession it names.

* ``spark_remote`` (or the ``SPARK_REMOTE`` environment variable): a Spark Connect server
  (``sc://host:15002``); the worker is a thin client and the data never passes through it.
* otherwise local mode in the worker (``local[*]``, or ``spark_master``).

The staging code is the same either way: it uses only the DataFrame API (``mapInArrow``,
no RDDs), which Spark Connect supports.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

DEFAULT_MASTER = "local[*]"

# Local mode in a worker: no UI port, few shuffle partitions, UTC timestamps, and Arrow
# batches small enough that a Python worker's memory stays flat.
LOCAL_CONF: dict[str, str] = {
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "8",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.execution.arrow.maxRecordsPerBatch": "8192",
    "spark.sql.adaptive.enabled": "true",
    # local mode runs its executors in this process: nothing need listen beyond loopback
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.driver.host": "127.0.0.1",
}
# What a Spark Connect client may set on its own session: the SQL settings above (the UI is
# the server's). The UTC time zone matters most: a timestamp slice column is written as text
# in the eval index, so a server in another zone would stage other bytes and another version.
CONNECT_CONF: dict[str, str] = {k: v for k, v in LOCAL_CONF.items() if k.startswith("spark.sql.")}


def session_settings(
    *,
    spark_remote: str | None = None,
    spark_master: str | None = None,
    conf: Mapping[str, str] | None = None,
    env: Mapping[str, str] | None = None,
) -> dict:
    """``{"mode": "connect"|"local", "url": ..., "conf": {...}}`` (pure).

    ``spark_remote`` wins over ``SPARK_REMOTE`` in ``env``; a remote and a master at once
    is refused, since only one of them can be where Spark runs.
    """
    remote = spark_remote or (env or {}).get("SPARK_REMOTE") or None
    if remote and spark_master:
        raise ValueError(
            f"spark_remote {remote!r} and spark_master {spark_master!r} are both set: use "
            "spark_remote for a Spark Connect server or spark_master for a local/cluster "
            "master, not both"
        )
    if remote is not None and not remote.startswith("sc://"):
        raise ValueError(
            f"spark_remote must be a Spark Connect URL such as 'sc://spark-connect:15002', got {remote!r}"
        )
    extra = {str(k): str(v) for k, v in (conf or {}).items()}
    if remote:
        return {"mode": "connect", "url": remote, "conf": {**CONNECT_CONF, **extra}}
    return {"mode": "local", "url": spark_master or DEFAULT_MASTER, "conf": {**LOCAL_CONF, **extra}}


def remote_from_connection(conn_id: str, host: str | None, port: int | None) -> str:
    """The Spark Connect URL an Airflow connection names: its host (``sc://...`` kept as it
    is; a bare host gets ``sc://``) and port (default 15002). Pure."""
    if not host:
        raise ValueError(
            f"Airflow connection {conn_id!r} has no host: set it to the Spark Connect server, "
            "such as 'spark-connect' with port 15002"
        )
    if host.startswith("sc://"):
        return host
    return f"sc://{host}:{int(port or 15002)}"


def get_session(settings: dict):
    """The SparkSession ``settings`` names (an active one with the same master is reused)."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName("trainops-staging")
    conf = dict(settings["conf"])
    if settings["mode"] == "connect":
        builder = builder.remote(settings["url"])
    else:
        builder = builder.master(settings["url"])
        # Local executors run this interpreter (with trainops importable), not `python3` on
        # PATH; PySpark reads the interpreter from the environment when the context starts.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    for key, value in conf.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()
