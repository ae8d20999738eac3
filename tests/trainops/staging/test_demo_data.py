import io

from trainer.storage import open_storage
from trainops.staging.demo_data import SOURCES, demo_rows, write_demo_dataset


def test_same_arguments_write_byte_identical_files(tmp_path):
    a = write_demo_dataset(f"file://{tmp_path}/a", rows=300, seed=3)
    b = write_demo_dataset(f"file://{tmp_path}/b", rows=300, seed=3)
    c = write_demo_dataset(f"file://{tmp_path}/c", rows=300, seed=4)
    storage = open_storage(a["uri"])
    assert a["rows"] == 300 and len(a["files"]) == 2
    assert [storage.get(u) for u in a["files"]] == [storage.get(u) for u in b["files"]]
    assert storage.get(a["files"][0]) != storage.get(c["files"][0])


def test_rows_are_short_templated_text_with_unique_ids(tmp_path):
    import pyarrow.parquet as pq

    out = write_demo_dataset(f"file://{tmp_path}/d", rows=600, seed=0, files=3)
    storage = open_storage(out["uri"])
    table = pq.read_table(io.BytesIO(storage.get(out["files"][1])))
    assert table.num_rows == 200
    assert str(table.schema.field("created_at").type) == "timestamp[us, tz=UTC]"
    cols = demo_rows(600, seed=0)
    assert len(set(cols["id"])) == 600
    assert set(cols["source"]) == set(SOURCES)
    assert all(20 <= len(t) <= 120 for t in cols["text"])
    # a small vocabulary is what makes the text learnable in ~100 steps
    assert len({w for t in cols["text"] for w in t.split()}) < 150


def test_corrupt_data_has_the_documented_defects():
    cols = demo_rows(120, seed=1, corrupt=True)
    ids = [i for i in cols["id"] if i is not None]
    assert cols["id"].count(None) == 2
    assert len(ids) - len(set(ids)) == 2
    assert cols["text"].count("") == 3
