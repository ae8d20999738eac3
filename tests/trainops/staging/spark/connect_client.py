"""Stage through a Spark Connect server, as a worker does with ``spark_remote``; run as a script
by ``test_connect.py``, in a process of its own (PySpark refuses a Connect client in a process
that already runs a classic session, as the other Spark tests' does).

    python connect_client.py URL ROOT SOURCE OPTIONS_JSON

Stages ``SOURCE`` under ``ROOT`` with ``spark_remote=URL``: this client only sends plans over
gRPC; the server's executors read the source, tokenize and write the shards. Prints the
staging result as JSON.
"""

from __future__ import annotations

import json
import sys


def main() -> None:
    url, root, source, options = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
    from trainer.storage import open_storage
    from trainops.staging.spark.stage import stage_dataset_spark

    result = stage_dataset_spark(open_storage(root), root, source, "demo", spark_remote=url, **options)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
