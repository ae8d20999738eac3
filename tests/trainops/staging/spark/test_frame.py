"""Row numbers in source order, whatever splits Spark reads (the pure parts)."""

from trainops.staging.spark.frame import path_key, spark_path, split_offsets


def test_splits_are_numbered_by_object_then_offset():
    # (object index, block start, rows), in the order Spark happened to report them
    splits = [(1, 0, 5), (0, 4096, 3), (0, 0, 10), (1, 8192, 2)]
    assert split_offsets(splits) == {(0, 0): 0, (0, 4096): 10, (1, 0): 13, (1, 8192): 18}
    assert split_offsets([]) == {}


def test_spark_file_paths_match_the_listed_objects():
    assert path_key("file:/data/raw/a b.parquet") == path_key("file:///data/raw/a%20b.parquet")
    assert path_key("s3a://bucket/raw/a.parquet") == path_key("s3://bucket/raw/a.parquet")
    assert path_key("file:/data/raw/a.parquet") != path_key("file:/data/raw/b.parquet")
    assert spark_path("s3://bucket/raw/a.parquet") == "s3a://bucket/raw/a.parquet"
    assert spark_path("file:///data/a.parquet") == "file:///data/a.parquet"
