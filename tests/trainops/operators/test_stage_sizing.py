"""The staging pod's size from the source it stages: the bytes, counted here again by hand."""

import math

from trainops.operators.stage_sizing import stage_pod

GIB, MIB = 2**30, 2**20


def test_a_jsonl_source_on_s3_with_the_byte_tokenizer():
    pod = stage_pod([(30 * GIB, "jsonl"), (10 * GIB, "jsonl")], downloads=True, hf_tokenizer=False)
    text = 40 * GIB
    batch = min(65536 * 16 * 1024, 30 * GIB)  # 65536 rows of 16 KiB: 1 GiB
    partition = math.ceil(text / 256)  # 40 GiB of text: the most partitions, 256
    memory = max(4 * GIB, math.ceil((2 * GIB + 5 * batch + partition) * 1.25))
    shards, spill, download = 2 * text, text, 30 * GIB
    files = shards + spill + download
    disk = files + math.ceil(files * 0.25) + 2 * GIB
    assert pod.options() == {
        "cpu": "2",
        "memory": f"{math.ceil(memory / GIB)}Gi",
        "ephemeral_storage": f"{math.ceil(disk / GIB)}Gi",
    }
    assert pod.options()["memory"] == "9Gi" and pod.options()["ephemeral_storage"] == "190Gi"


def test_a_small_parquet_source_read_in_place_with_a_hugging_face_tokenizer():
    pod = stage_pod([(200 * MIB, "parquet")], downloads=False, hf_tokenizer=True, batch_rows=1024)
    text = 3 * 200 * MIB  # Parquet's text: 3 times its compressed bytes
    batch = min(1024 * 16 * 1024, text)  # 16 MiB: the batch, not the object, is smaller
    partition = math.ceil(text / 16)  # 600 MiB over the fewest partitions
    memory = max(4 * GIB, math.ceil((2 * GIB + GIB + 5 * batch + partition) * 1.25))
    files = 2 * text + text  # no download: file:// is read in place
    disk = files + max(2 * GIB, math.ceil(files * 0.25)) + 2 * GIB
    assert pod.memory_bytes == memory and pod.disk_bytes == disk
    assert pod.options() == {"cpu": "2", "memory": "4Gi", "ephemeral_storage": "6Gi"}


def test_describe_names_what_was_counted():
    line = stage_pod([(30 * GIB, "jsonl")], downloads=True, hf_tokenizer=False).describe()
    assert line.startswith("staging pod: memory 9Gi = process 2Gi + 5 copies of one batch of text (1Gi)")
    assert "every shard (60Gi)" in line and "one download 30Gi" in line and "for 30Gi of text" in line
