"""A Spark Connect server for ``test_connect.py``: a local Spark (two cores) whose Connect plugin
serves gRPC on 127.0.0.1:PORT, its executors running this interpreter (so they import
trainops, as a real server's image must). Prints ``ready`` once it listens, then serves until
its standard input closes.

    python connect_server.py PORT
"""

from __future__ import annotations

import os
import sys


def main() -> None:
    port = sys.argv[1]
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2]")
        .config("spark.plugins", "org.apache.spark.sql.connect.SparkConnectPlugin")
        .config("spark.connect.grpc.binding.address", "127.0.0.1")
        .config("spark.connect.grpc.binding.port", port)
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .getOrCreate()
    )
    print("ready", flush=True)
    sys.stdin.read()  # until the test closes it
    session.stop()


if __name__ == "__main__":
    main()
