"""Every bad input the issue lists: a clear error (or counted quarantine), and nothing that
looks like a staged dataset left behind. ``s3://`` cases run against moto over HTTP."""

import json
import time

import pytest

from tests.trainops.staging.helpers import assert_nothing_valid_looking
from trainer.contract import join
from trainer.storage import StorageError, open_storage
from trainops.staging.demo_data import demo_rows
from trainops.staging.errors import (
    DataValidationError,
    SourceNotFound,
    SourceUnreachable,
    StagingError,
)
from trainops.staging.stage import stage_dataset


@pytest.fixture(params=["file", "s3"])
def where(request, tmp_path):
    """``(storage root, raw data prefix)`` on local files or on the moto S3 server."""
    if request.param == "file":
        return f"file://{tmp_path}/root", f"file://{tmp_path}/raw"
    root = request.getfixturevalue("s3_root")
    return root, root.replace("/root", "/raw")


def _cols(n: int = 120, seed: int = 1) -> dict:
    return {k: v for k, v in demo_rows(n, seed=seed).items() if k != "created_at"}


def _parquet(uri: str, cols: dict, **options) -> str:
    import pyarrow as pa
    import pyarrow.parquet as pq

    sink = pa.BufferOutputStream()
    pq.write_table(pa.table(cols), sink, **options)
    open_storage(uri).put(uri, sink.getvalue().to_pybytes())
    return uri


def _stage(root: str, source: str, **kwargs):
    return stage_dataset(open_storage(root), root, source, "bad", **kwargs)


def test_empty_prefix(where):
    root, raw = where
    open_storage(raw).put(f"{raw}/_SUCCESS", b"")  # a marker, but no data
    with pytest.raises(
        SourceNotFound,
        match=f"'{raw}' does not exist or is an empty prefix: point it at a Parquet/JSONL/CSV object",
    ):
        _stage(root, raw)
    assert open_storage(root).list(root) == []


def test_missing_column(where):
    root, raw = where
    cols = _cols()
    _parquet(f"{raw}/a.parquet", cols)
    del cols["source"]
    _parquet(f"{raw}/b.parquet", cols)
    with pytest.raises(
        StagingError,
        match=r"b.parquet' lacks columns \['source'\] \(it has "
        r"\['id', 'text'\]\): add them to the data",
    ):
        _stage(root, raw)
    assert open_storage(root).list(root) == []


def test_wrong_type_in_parquet(where):
    root, raw = where
    cols = _cols()
    cols["text"] = list(range(len(cols["text"])))
    _parquet(f"{raw}/a.parquet", cols)
    with pytest.raises(
        StagingError,
        match="has column 'text' of type int64, but staging tokenizes text: write 'text' as strings",
    ):
        _stage(root, raw)
    assert open_storage(root).list(root) == []


def test_wrong_type_within_a_jsonl_file(tmp_path, file_root):
    lines = [{"id": f"r{i}", "text": f"text {i}", "source": "news"} for i in range(50)]
    lines[30]["text"] = {"nested": True}
    path = tmp_path / "raw" / "data.jsonl"
    path.parent.mkdir()
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    with pytest.raises(
        StagingError, match=r"data.jsonl' cannot be read as jsonl .*: a column changes type within the file"
    ):
        _stage(file_root, f"file://{path}")
    assert open_storage(file_root).list(file_root) == []


def test_nulls_above_the_threshold(where):
    root, raw = where
    cols = _cols(200)
    for i in range(0, 200, 8):  # 25 of 200: 12.5% null
        cols["source"][i] = None
    _parquet(f"{raw}/a.parquet", cols)
    suite = [
        {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "source", "mostly": 0.9}},
        {
            "type": "expect_column_proportion_of_non_null_values_to_be_between",
            "kwargs": {"column": "source", "min_value": 0.95},
        },
    ]
    with pytest.raises(DataValidationError) as err:
        _stage(root, raw, expectations=suite)
    message = str(err.value)
    assert "expect_column_values_to_not_be_null on 'source': 25 unexpected" in message
    assert (
        "expect_column_proportion_of_non_null_values_to_be_between on 'source': observed "
        "0.875 (25 unexpected)"
    ) in message
    assert_nothing_valid_looking(open_storage(root), root)
    # the same share of nulls passes when the threshold allows it
    suite[0]["kwargs"]["mostly"], suite[1]["kwargs"]["min_value"] = 0.85, 0.85
    suite.append({"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "text"}})
    assert _stage(root, raw, expectations=suite, slice_columns=[])["rows"] == 200


def test_duplicate_ids_across_files(where):
    root, raw = where
    cols = _cols(300)
    _parquet(f"{raw}/a.parquet", {k: v[:150] for k, v in cols.items()})
    second = {k: v[150:] for k, v in cols.items()}
    second["id"][149] = cols["id"][0]
    second["id"][10] = cols["id"][20]
    _parquet(f"{raw}/b.parquet", second)
    with pytest.raises(DataValidationError) as err:
        _stage(root, raw)
    dupes = sorted([cols["id"][0], cols["id"][20]])
    assert (
        f"expect_column_values_to_be_unique on 'id': 4 unexpected (ids {dupes[0]!r}, {dupes[1]!r})"
    ) in str(err.value)
    assert_nothing_valid_looking(open_storage(root), root)


@pytest.mark.parametrize("damage", ["truncated", "not parquet"])
def test_truncated_or_corrupt_parquet(where, damage):
    root, raw = where
    good = _parquet(f"{raw}/a.parquet", _cols())
    storage = open_storage(raw)
    blob = storage.get(good)
    storage.put(
        f"{raw}/b.parquet", blob[: len(blob) // 2] if damage == "truncated" else b"this is not parquet at all"
    )
    with pytest.raises(
        StagingError,
        match=r"b.parquet' cannot be read as parquet .*: it is truncated or not Parquet: re-export it",
    ):
        _stage(root, raw)
    assert open_storage(root).list(root) == []


def test_corrupt_page_inside_a_parquet_file(file_root, tmp_path):
    path = tmp_path / "raw" / "a.parquet"
    path.parent.mkdir()
    _parquet(f"file://{path}", _cols(2000), compression="snappy", row_group_size=500)
    data = bytearray(path.read_bytes())
    for i in range(len(data) // 3, len(data) // 3 + 64):  # scribble over a data page
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(StagingError, match=r"a.parquet' cannot be read as parquet"):
        _stage(file_root, f"file://{path}")
    assert_nothing_valid_looking(open_storage(file_root), file_root)


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_non_utf8_text(where, fmt):
    root, raw = where
    text = "caf\u00e9 au lait".encode("latin-1")  # é as one byte: not UTF-8
    if fmt == "csv":
        body = b"id,text,source\n" + b"".join(b"r%d,%s,news\n" % (i, text) for i in range(20))
    else:
        body = b"".join(b'{"id": "r%d", "text": "%s", "source": "news"}\n' % (i, text) for i in range(20))
    open_storage(raw).put(f"{raw}/data.{fmt}", body)
    with pytest.raises(
        StagingError, match=f"data.{fmt}' cannot be read as {fmt} .*: re-encode the file as UTF-8"
    ):
        _stage(root, raw)
    assert open_storage(root).list(root) == []


def test_a_row_larger_than_a_shard(where):
    root, raw = where
    cols = _cols(100)
    cols["text"][42] = "y" * 3000
    _parquet(f"{raw}/a.parquet", cols)
    with pytest.raises(
        StagingError,
        match=f"record '{cols['id'][42]}' \\(row 42\\) has 3001 "
        "tokens, more than a shard holds \\(shard_tokens=2048"
        "\\): raise shard_tokens",
    ):
        _stage(root, raw, shard_tokens=2048)
    assert_nothing_valid_looking(open_storage(root), root)
    # counted quarantine instead of an error when asked for
    result = _stage(root, raw, shard_tokens=2048, quarantine={"max_fraction": 0.02})
    assert (result["rows"], result["quarantined_rows"]) == (99, 1)


def _closed_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # nothing listens once the socket is closed


def test_unreachable_s3_endpoint_fails_fast(monkeypatch, file_root):
    endpoint = f"http://127.0.0.1:{_closed_port()}"
    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_REGION": "us-east-1",
        "AWS_ENDPOINT_URL_S3": endpoint,
    }.items():
        monkeypatch.setenv(name, value)
    started = time.monotonic()
    with pytest.raises(
        SourceUnreachable,
        match=f"cannot reach the S3 endpoint {endpoint} for 's3://bucket/raw' .*: check the endpoint_url",
    ):
        stage_dataset(
            open_storage(file_root),
            file_root,
            "s3://bucket/raw",
            "bad",
            source_storage=open_storage("s3://bucket/raw"),
        )
    assert time.monotonic() - started < 10
    assert open_storage(file_root).list(file_root) == []


def test_denied_credentials(s3_root, file_root, deny_s3):
    raw = s3_root.replace("/root", "/raw")
    _parquet(f"{raw}/a.parquet", _cols())
    deny_s3()
    with pytest.raises(StorageError, match=f"access denied to '{raw}' .*: check the credentials"):
        _stage(file_root, raw, source_storage=open_storage(raw))
    assert open_storage(file_root).list(file_root) == []


def test_denied_credentials_on_the_storage_root(s3_root, raw_uri, deny_s3):
    _parquet(f"{raw_uri}/a.parquet", _cols())
    deny_s3()
    with pytest.raises(StorageError, match=r"access denied to .*manifest.json"):
        stage_dataset(open_storage(s3_root), s3_root, raw_uri, "bad", source_storage=open_storage(raw_uri))


def test_a_failed_run_never_shadows_a_good_version(file_root, raw_uri):
    """A good version stays readable and unchanged whatever fails after it."""
    storage = open_storage(file_root)
    _parquet(f"{raw_uri}/a.parquet", _cols(150))
    good = _stage(file_root, raw_uri)
    before = {u: storage.head(u)["etag"] for u in storage.list(file_root)}
    storage.put(f"{raw_uri}/b.parquet", b"junk")
    with pytest.raises(StagingError):
        _stage(file_root, raw_uri)
    assert {u: storage.head(u)["etag"] for u in storage.list(file_root)} == before
    assert storage.get_json(join(good["uri"], "manifest.json"))["rows"]["total"] == 150


def test_a_zero_byte_parquet_object_is_refused_before_anything_is_written(where):
    root, raw = where
    _parquet(f"{raw}/a.parquet", _cols())
    open_storage(raw).put(f"{raw}/b.parquet", b"")  # a failed or unfinished export
    with pytest.raises(StagingError) as err:
        _stage(root, raw)
    assert str(err.value) == (
        f"source objects '{raw}/b.parquet' are empty (0 bytes), which is not a Parquet file (one without rows "
        "still holds its schema): re-export them, or remove them from the source"
    )
    assert open_storage(root).list(root) == []


def test_a_zero_byte_jsonl_object_is_an_empty_file_and_stages(where):
    root, raw = where
    _parquet(f"{raw}/a.parquet", _cols(120))
    open_storage(raw).put(f"{raw}/b.jsonl", b"")  # an empty partition's part file
    assert _stage(root, raw)["rows"] == 120


def test_a_column_whose_type_drifts_between_files_is_refused_naming_files_and_types(where):
    root, raw = where
    stamped = demo_rows(120, seed=1)  # created_at: timestamps
    _parquet(f"{raw}/a.parquet", stamped)
    texted = demo_rows(120, seed=2)
    texted["id"] = [f"b-{i}" for i in texted["id"]]
    texted["created_at"] = [t.isoformat() for t in texted["created_at"]]  # the same, as strings
    _parquet(f"{raw}/b.parquet", texted)
    with pytest.raises(StagingError) as err:
        _stage(root, raw)
    assert str(err.value) == (
        "the source's objects disagree on column types, so nothing was staged: 'created_at' is "
        f"timestamp[us, tz=UTC] in '{raw}/a.parquet' but string in '{raw}/b.parquet'; write each column with one "
        "type in every file (or cast it before staging)"
    )
    assert open_storage(root).list(root) == []
