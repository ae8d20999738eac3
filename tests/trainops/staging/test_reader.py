import json

import pytest

from trainer.storage import open_storage
from trainops.staging import reader
from trainops.staging.errors import SourceNotFound, StagingError
from trainops.staging.reader import iter_file_batches, list_source_objects, local_copy


def _jsonl(n: int, start: int = 0) -> bytes:
    return "".join(
        json.dumps({"id": f"r{i}", "text": f"text number {i} " * 5, "source": "news"}) + "\n"
        for i in range(start, start + n)
    ).encode()


def _csv(n: int) -> bytes:
    # Digit-only ids would be inferred as integers block by block; they must stay text.
    return ("id,text,source\n" + "".join(f'{i:05d},"text, number {i}",docs\n' for i in range(n))).encode()


@pytest.fixture
def never_read_whole(monkeypatch):
    """Reading a whole file into one table is what bounded memory forbids."""
    import pyarrow.csv
    import pyarrow.json
    import pyarrow.parquet

    def refuse(*args, **kwargs):
        raise AssertionError("read a whole file at once")

    for module, name in (
        (pyarrow.json, "read_json"),
        (pyarrow.csv, "read_csv"),
        (pyarrow.parquet, "read_table"),
    ):
        monkeypatch.setattr(module, name, refuse)


@pytest.mark.parametrize("fmt, data", [("jsonl", _jsonl(3000)), ("csv", _csv(3000))])
def test_text_formats_stream_in_bounded_batches(fmt, data, tmp_path, monkeypatch, never_read_whole):
    monkeypatch.setattr(reader, "_BLOCK_BYTES", 16 << 10)  # many blocks from a small file
    path = tmp_path / f"data.{fmt}"
    path.write_bytes(data)
    [obj] = list_source_objects(open_storage(f"file://{tmp_path}"), f"file://{path}")
    batches = list(iter_file_batches(str(path), obj, batch_rows=700, string_columns=["id", "text", "source"]))
    assert [b.num_rows for b in batches] == [700] * 4 + [200]
    ids = [i for b in batches for i in b.column("id").to_pylist()]
    assert len(ids) == 3000 and len(set(ids)) == 3000
    assert all(isinstance(i, str) for i in ids)
    if fmt == "csv":
        assert ids[:2] == ["00000", "00001"]


def test_parquet_streams_row_batches(tmp_path, never_read_whole):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "data.parquet"
    pq.write_table(
        pa.table({"id": [f"r{i}" for i in range(1000)], "text": ["t"] * 1000}), path, row_group_size=300
    )
    [obj] = list_source_objects(open_storage(f"file://{tmp_path}"), f"file://{path}")
    sizes = [b.num_rows for b in iter_file_batches(str(path), obj, batch_rows=256)]
    assert sizes == [256, 256, 256, 232]


def test_prefixes_globs_and_single_objects(tmp_path):
    storage = open_storage(f"file://{tmp_path}")
    for rel in (
        "a/one.jsonl",
        "a/sub/two.jsonl",
        "a/sub/three.csv",
        "a/_SUCCESS",
        "a/.hidden/four.jsonl",
        "a/notes.txt",
    ):
        storage.put(f"file://{tmp_path}/{rel}", b"{}\n")
    names = lambda uri: [o.uri.split("/a/")[1] for o in list_source_objects(storage, uri)]  # noqa: E731
    assert names(f"file://{tmp_path}/a") == ["one.jsonl", "sub/three.csv", "sub/two.jsonl"]
    assert names(f"file://{tmp_path}/a/*.jsonl") == ["one.jsonl"]
    assert names(f"file://{tmp_path}/a/**/*.jsonl") == ["one.jsonl", "sub/two.jsonl"]
    assert names(f"file://{tmp_path}/a/sub/two.jsonl") == ["sub/two.jsonl"]
    with pytest.raises(SourceNotFound, match=r"a/\*\.parquet' matches no objects"):
        list_source_objects(storage, f"file://{tmp_path}/a/*.parquet")
    with pytest.raises(StagingError, match="none ends in"):
        list_source_objects(storage, f"file://{tmp_path}/a/*.txt")


def test_s3_glob_lists_and_downloads_one_object_at_a_time(s3_root, tmp_path):
    storage = open_storage(s3_root)
    for n in range(3):
        storage.put(f"{s3_root}/raw/day={n}/part.jsonl", _jsonl(10, n * 10))
    storage.put(f"{s3_root}/raw/day=1/part.csv", _csv(5))
    objects = list_source_objects(storage, f"{s3_root}/raw/day=*/*.jsonl")
    assert [o.uri for o in objects] == [f"{s3_root}/raw/day={n}/part.jsonl" for n in range(3)]
    assert all(o.etag and o.size for o in objects)
    with local_copy(storage, objects[1], str(tmp_path)) as path:
        assert [p.name for p in tmp_path.iterdir()] == ["source.jsonl"]
        rows = [i for b in iter_file_batches(path, objects[1]) for i in b.column("id").to_pylist()]
    assert rows == [f"r{i}" for i in range(10, 20)]
    assert list(tmp_path.iterdir()) == []  # the download is gone once read


def test_empty_objects_hold_no_rows_and_are_skipped(file_root, tmp_path):
    from trainops.staging.stage import stage_dataset

    storage = open_storage(file_root)
    storage.put(f"file://{tmp_path}/raw/a.jsonl", _jsonl(40))
    storage.put(f"file://{tmp_path}/raw/b.jsonl", b"")  # a writer's empty part file
    storage.put(f"file://{tmp_path}/raw/c.csv", b"id,text,source\n")  # a header, no rows
    result = stage_dataset(storage, file_root, f"file://{tmp_path}/raw", "e")
    assert result["rows"] == 40


def test_a_zero_byte_parquet_object_is_refused_a_zero_byte_text_one_is_not():
    def obj(name, size):
        return reader.SourceObject(f"file:///raw/{name}", size, None, 0.0, reader.format_of(name))

    reader.check_not_empty_parquet([obj("a.parquet", 10), obj("b.jsonl", 0), obj("c.csv", 0)])
    with pytest.raises(StagingError) as err:
        reader.check_not_empty_parquet([obj("a.parquet", 10), obj(f"p{0}.parquet", 0), obj("b.pq", 0)])
    assert str(err.value) == (
        "source objects 'file:///raw/p0.parquet', 'file:///raw/b.pq' are empty (0 bytes), which is not a Parquet "
        "file (one without rows still holds its schema): re-export them, or remove them from the source"
    )
    with pytest.raises(StagingError, match=r"'file:///raw/e2.parquet' and 2 more are empty"):
        reader.check_not_empty_parquet([obj(f"e{i}.parquet", 0) for i in range(5)])
