import pytest

from trainops.staging.globs import glob_filter, glob_regex, split_glob


def test_split_glob_keeps_the_fixed_prefix():
    assert split_glob("s3://b/raw/2026-*/part-*.parquet") == ("s3://b/raw", "2026-*/part-*.parquet")
    assert split_glob("file:///d/**/*.jsonl") == ("file:///d", "**/*.jsonl")
    assert split_glob("s3://b/raw/data.csv") == ("s3://b/raw/data.csv", None)
    with pytest.raises(ValueError, match="wildcard in the bucket name"):
        split_glob("s3://logs-*/raw/a.parquet")


@pytest.mark.parametrize(
    "pattern, key, hit",
    [
        ("*.parquet", "a.parquet", True),
        ("*.parquet", "sub/a.parquet", False),  # * stays inside one segment
        ("**/*.jsonl", "a.jsonl", True),  # ** matches zero segments
        ("**/*.jsonl", "x/y/z.jsonl", True),
        ("**/*.jsonl", "x/y/z.json", False),
        ("2026-0?/part-[0-9].csv", "2026-01/part-3.csv", True),
        ("2026-0?/part-[!0-9].csv", "2026-01/part-3.csv", False),
        ("a+b/(c).csv", "a+b/(c).csv", True),  # regex characters are literal
        ("**", "any/thing.parquet", True),
    ],
)
def test_patterns_match_like_a_shell_glob_with_globstar(pattern, key, hit):
    assert bool(glob_regex(pattern).match(key)) is hit


def test_glob_filter_matches_relative_to_the_prefix():
    uris = ["s3://b/raw/a.parquet", "s3://b/raw/x/b.parquet", "s3://b/rawer/c.parquet"]
    assert glob_filter("s3://b/raw", "*.parquet", uris) == ["s3://b/raw/a.parquet"]
    assert glob_filter("s3://b/raw", "**/*.parquet", uris) == uris[:2]
