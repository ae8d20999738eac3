"""One local Spark session for every Spark test (starting one costs seconds); import `spark`
into a conftest or test module to use it."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def spark():
    """``local[2]``, four shuffle partitions, no UI: what the embedded default runs, made small."""
    pytest.importorskip("pyspark")
    import logging

    logging.getLogger("py4j").setLevel(logging.WARNING)  # no "closing connection" at exit
    from trainops.staging.spark.session import get_session, session_settings

    settings = session_settings(
        spark_master="local[2]",
        conf={"spark.sql.shuffle.partitions": "4", "spark.driver.memory": "1g"},
    )
    session = get_session(settings)
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
