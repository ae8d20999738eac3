"""The Spark staging engine: the same validation, version and shards, computed on Spark.

``session`` decides where Spark runs (local mode in the worker, or a Spark Connect
server); ``frame`` reads the source with a source-order row number; ``validate`` runs the
suite on the DataFrame; ``quarantine`` sets bad rows aside; ``pack`` tokenizes and writes the shards from the executors;
``stage`` drives them and commits. Nothing here is imported at DAG-parse time, and
pyspark is imported only inside functions, so the ``spark`` extra stays optional.
"""
