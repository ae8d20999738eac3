"""Row numbers in source order, whatever splits Spark reads (the pure parts)."""

from trainops.staging.spark.frame import object_of, path_key, spark_path, split_offsets


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


def test_a_row_number_names_its_object():
    starts = [(0, 0), (10, 2), (25, 3)]  # object 1 had no rows
    assert [object_of(starts, r) for r in (0, 9, 10, 24, 25, 99)] == [0, 0, 2, 2, 3, 3]
