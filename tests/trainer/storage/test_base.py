"""The storage interface (``trainer.storage.base.Storage``), held to both backends: a real
directory and a real S3 server (moto over HTTP)."""

from __future__ import annotations

import hashlib
import os
import threading

import pytest

from trainer.storage import (
    NotFound,
    PreconditionFailed,
    StorageError,
    open_storage,
)


@pytest.fixture(params=["file_root", "s3_root"])
def root(request) -> str:
    return request.getfixturevalue(request.param)


def test_put_get_head_round_trip(root):
    store = open_storage(root)
    uri = f"{root}/runs/a/config.yaml"
    etag = store.put(uri, b"lr: 0.1\n")

    assert etag == hashlib.md5(b"lr: 0.1\n").hexdigest()
    assert store.get(uri) == b"lr: 0.1\n"
    assert store.get_with_etag(uri) == (b"lr: 0.1\n", etag)
    head = store.head(uri)
    assert head["size"] == 8 and head["etag"] == etag and head["mtime"] > 0
    assert store.exists(uri)
    assert store.head(f"{root}/runs/a/other") is None
    assert not store.exists(f"{root}/runs/a/other")


def test_json_round_trip(root):
    store = open_storage(root)
    store.put_json(f"{root}/job.json", {"attempts": [{"n": 1}], "state": "running"})
    assert store.get_json(f"{root}/job.json") == {"attempts": [{"n": 1}], "state": "running"}


def test_get_json_names_the_object_when_it_is_not_json(root):
    store = open_storage(root)
    store.put(f"{root}/bad.json", b"{not json")
    with pytest.raises(StorageError, match=r"bad.json.*not valid JSON"):
        store.get_json(f"{root}/bad.json")


def test_missing_object_raises_not_found(root):
    store = open_storage(root)
    with pytest.raises(NotFound, match=r"missing.bin"):
        store.get(f"{root}/missing.bin")
    with pytest.raises(FileNotFoundError):
        store.get_json(f"{root}/missing.json")


def test_list_is_recursive_sorted_and_does_not_leak_sibling_prefixes(root):
    store = open_storage(root)
    for key in ["run1/b", "run1/a/x", "run10/x", "run1.json"]:
        store.put(f"{root}/{key}", b"1")

    expected = [f"{root}/run1/a/x", f"{root}/run1/b"]
    assert store.list(f"{root}/run1") == expected
    assert store.list(f"{root}/run1/") == expected
    assert store.list(f"{root}/nothing-here") == []
    assert store.list(root) == sorted(f"{root}/{k}" for k in ["run1/b", "run1/a/x", "run10/x", "run1.json"])


def test_list_hides_lock_and_temp_files_after_conditional_writes(root):
    store = open_storage(root)
    etag = store.put(f"{root}/p/production.json", b"{}", if_none_match=True)
    store.put(f"{root}/p/production.json", b"[]", if_match=etag)
    assert store.list(f"{root}/p") == [f"{root}/p/production.json"]


def test_delete_and_delete_prefix(root):
    store = open_storage(root)
    for key in ["ckpt/step_1/a", "ckpt/step_1/b", "ckpt/step_10/a", "keep"]:
        store.put(f"{root}/{key}", b"x")

    store.delete(f"{root}/keep")
    store.delete(f"{root}/keep")  # already gone: no error
    assert not store.exists(f"{root}/keep")

    assert store.delete_prefix(f"{root}/ckpt/step_1") == 2
    assert store.list(root) == [f"{root}/ckpt/step_10/a"]
    assert store.delete_prefix(f"{root}/ckpt/step_1") == 0


def test_copy(root):
    store = open_storage(root)
    store.put(f"{root}/src/w.safetensors", b"weights")
    store.copy(f"{root}/src/w.safetensors", f"{root}/models/m/versions/1/w.safetensors")
    assert store.get(f"{root}/models/m/versions/1/w.safetensors") == b"weights"
    with pytest.raises(NotFound, match="nope"):
        store.copy(f"{root}/src/nope", f"{root}/dst")


def test_if_none_match_creates_once(root):
    store = open_storage(root)
    uri = f"{root}/models/m/versions/3/card.json"
    store.put(uri, b"first", if_none_match=True)
    with pytest.raises(PreconditionFailed, match=r"card.json"):
        store.put(uri, b"second", if_none_match=True)
    assert store.get(uri) == b"first"


def test_if_match_right_etag_wins_and_stale_etag_loses(root):
    store = open_storage(root)
    uri = f"{root}/models/m/production.json"
    v1 = store.put(uri, b'{"version": 1}')
    v2 = store.put(uri, b'{"version": 2}', if_match=v1)
    assert store.get(uri) == b'{"version": 2}'

    with pytest.raises(PreconditionFailed):
        store.put(uri, b'{"version": 3}', if_match=v1)
    assert store.get_with_etag(uri) == (b'{"version": 2}', v2)


def test_if_match_on_missing_object_fails(root):
    store = open_storage(root)
    with pytest.raises(PreconditionFailed, match="absent"):
        store.put(f"{root}/absent", b"x", if_match="0" * 32)
    assert not store.exists(f"{root}/absent")


def test_sixteen_threads_racing_if_match_exactly_one_wins(root):
    store = open_storage(root)
    uri = f"{root}/models/m/production.json"
    etag = store.put(uri, b"base")
    start = threading.Barrier(16)
    winners: list[int] = []
    losers: list[int] = []

    def contend(i: int) -> None:
        start.wait()
        try:
            store.put(uri, f"writer {i}".encode(), if_match=etag)
            winners.append(i)
        except PreconditionFailed:
            losers.append(i)

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert len(winners) == 1 and len(losers) == 15
    assert store.get(uri) == f"writer {winners[0]}".encode()


def test_a_conditional_write_leaves_its_write_token_and_a_plain_one_none(root, tmp_path):
    # file:// keeps the token as an extended attribute: not every filesystem has them.
    probe = tmp_path / "xattr-probe"
    probe.write_bytes(b"")
    try:
        os.setxattr(probe, "user.probe", b"1")
    except (OSError, AttributeError):  # AttributeError: not Linux
        pytest.skip(f"{tmp_path} has no user extended attributes")
    store = open_storage(root)
    uri = f"{root}/models/m/production.json"
    store.put(uri, b"1", if_none_match=True)
    created = store.head(uri)["write_token"]
    store.put_json(uri, {"v": 2}, if_match=store.head(uri)["etag"])
    swapped = store.head(uri)["write_token"]
    assert len(created) == len(swapped) == 32 and created != swapped
    store.put(uri, b"3")
    assert store.head(uri)["write_token"] is None
    assert store.list(f"{root}/models") == [uri]  # the token travels with the object, no sidecar


def test_upload_and_download_small_file(root, tmp_path):
    store = open_storage(root)
    local = tmp_path / "local"
    local.mkdir()
    (local / "small.bin").write_bytes(b"abc" * 1000)
    etag = store.upload_file(local / "small.bin", f"{root}/data/small.bin")
    assert etag == hashlib.md5(b"abc" * 1000).hexdigest()
    store.download_file(f"{root}/data/small.bin", local / "out" / "small.bin")
    assert (local / "out" / "small.bin").read_bytes() == b"abc" * 1000
    with pytest.raises(NotFound):
        store.download_file(f"{root}/data/nope.bin", local / "nope.bin")
    assert sorted(p.name for p in local.iterdir()) == ["out", "small.bin"]


def test_both_conditions_at_once_is_a_caller_error(root):
    with pytest.raises(ValueError, match="both if_none_match and if_match"):
        open_storage(root).put(f"{root}/x", b"1", if_none_match=True, if_match="abc")


def test_upload_with_move_hands_the_file_over(root, tmp_path):
    store = open_storage(root)
    local = tmp_path / "shard.bin"
    local.write_bytes(b"x" * 1000)
    etag = store.upload_file(local, f"{root}/ckpt/shard.bin", move=True)
    assert not local.exists()
    assert store.get(f"{root}/ckpt/shard.bin") == b"x" * 1000
    assert store.head(f"{root}/ckpt/shard.bin")["etag"] == etag
    assert store.list(f"{root}/ckpt") == [f"{root}/ckpt/shard.bin"]  # no temp file left behind


def test_unsupported_scheme_is_named():
    with pytest.raises(
        StorageError,
        match=r"unsupported storage URI 'gs://x': use file:///abs/path or s3://bucket/prefix",
    ):
        open_storage("gs://x")


def test_sha256_of_a_file_larger_than_one_read_matches_hashlib(tmp_path):
    from trainer.storage import sha256_file
    from trainer.storage.base import _CHUNK

    payload = os.urandom(2 * _CHUNK + 7)
    (tmp_path / "shard.bin").write_bytes(payload)
    assert sha256_file(tmp_path / "shard.bin") == hashlib.sha256(payload).hexdigest()


def test_a_hashed_download_gives_the_size_and_sha256_of_what_arrived(root, tmp_path):
    store = open_storage(root)
    payload = os.urandom(3 * 1024 * 1024 + 7)  # more than one chunk
    store.put(f"{root}/data/shard.bin", payload)
    got = store.download_file_hashed(f"{root}/data/shard.bin", tmp_path / "out" / "shard.bin")
    assert got == (len(payload), hashlib.sha256(payload).hexdigest())
    assert (tmp_path / "out" / "shard.bin").read_bytes() == payload
    with pytest.raises(NotFound):
        store.download_file_hashed(f"{root}/data/nope.bin", tmp_path / "nope.bin")
