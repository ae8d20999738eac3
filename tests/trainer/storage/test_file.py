"""``file://`` storage: conditional writes hold across processes, etags cost no read and change
with every write; paths must be absolute."""

from __future__ import annotations

import errno
import hashlib
import multiprocessing
import os
import time

import pytest

from tests.trainer.storage.reads import count_reads
from trainer.storage import (
    FileStorage,
    PreconditionFailed,
    StorageError,
    open_storage,
)


def _contend_in_process(uri: str, etag: str, i: int, barrier) -> None:
    barrier.wait()
    try:
        FileStorage().put(uri, f"process {i}".encode(), if_match=etag)
    except PreconditionFailed:
        os._exit(1)
    os._exit(0)


def test_processes_racing_if_match_on_files_exactly_one_wins(file_root):
    store = open_storage(file_root)
    uri = f"{file_root}/models/m/production.json"
    ctx = multiprocessing.get_context("fork")
    for _round in range(3):
        etag = store.put(uri, b"base")
        barrier = ctx.Barrier(6)
        procs = [ctx.Process(target=_contend_in_process, args=(uri, etag, i, barrier)) for i in range(6)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=30)
        codes = [p.exitcode for p in procs]
        assert sorted(codes) == [0, 1, 1, 1, 1, 1]
        winner = codes.index(0)
        assert store.get(uri) == f"process {winner}".encode()


def test_relative_file_path_is_rejected():
    with pytest.raises(StorageError, match=r"'file://data/root'.*absolute path"):
        open_storage("file://data/root")
    with pytest.raises(StorageError, match="absolute path"):
        FileStorage().put("file://data/x", b"x")


def _spy_on_content_hashing(monkeypatch) -> list[int]:
    """Every descriptor whose content ``FileStorage`` hashes to find an etag, from now on."""
    import trainer.storage.file as file_storage

    hashed: list[int] = []
    real = file_storage._md5_of_fd

    def spy(fd: int) -> str:
        hashed.append(fd)
        return real(fd)

    monkeypatch.setattr(file_storage, "_md5_of_fd", spy)
    return hashed


def test_head_of_a_large_file_this_client_wrote_reads_none_of_it(file_root, tmp_path, monkeypatch):
    store = open_storage(file_root)
    big = tmp_path / "big.bin"
    with open(big, "wb") as f:
        f.truncate(64 << 20)
    copied = store.upload_file(big, f"{file_root}/data/big.bin")
    moved = store.upload_file(big, f"{file_root}/ckpt/shard.bin", move=True)
    put = store.put(f"{file_root}/data/small.bin", b"x" * 1000)
    reads, hashed = count_reads(monkeypatch, [tmp_path]), _spy_on_content_hashing(monkeypatch)

    assert store.head(f"{file_root}/data/big.bin") == {
        "size": 64 << 20,
        "etag": copied,
        "mtime": os.stat(tmp_path / "root/data/big.bin").st_mtime,
        "write_token": None,
    }
    assert store.head(f"{file_root}/ckpt/shard.bin")["etag"] == moved
    assert store.head(f"{file_root}/data/small.bin")["etag"] == put
    assert store.head(f"{file_root}/data") is None  # a folder is no object
    assert (dict(reads), hashed) == ({}, [])  # not a byte of any of them was read


def test_an_etag_is_the_md5_of_the_bytes_written_except_for_a_file_handed_over(file_root, tmp_path):
    store = open_storage(file_root)
    uri = f"{file_root}/runs/a/latest.json"
    written = store.put(uri, b'{"step": 1}')
    assert written == hashlib.md5(b'{"step": 1}').hexdigest()  # as S3's
    assert store.get_with_etag(uri) == (b'{"step": 1}', written)
    assert store.head(uri)["etag"] == written
    (tmp_path / "shard").write_bytes(b'{"step": 1}')
    moved = store.upload_file(tmp_path / "shard", f"{file_root}/runs/a/shard", move=True)
    assert moved != written and store.head(f"{file_root}/runs/a/shard")["etag"] == moved  # never read


def test_a_file_another_program_wrote_has_the_md5_of_its_content_as_etag(file_root, tmp_path, monkeypatch):
    store = open_storage(file_root)
    (tmp_path / "root/data").mkdir(parents=True)
    (tmp_path / "root/data/table.csv").write_bytes(b"a,b\n1,2\n")
    hashed = _spy_on_content_hashing(monkeypatch)
    assert store.head(f"{file_root}/data/table.csv")["etag"] == hashlib.md5(b"a,b\n1,2\n").hexdigest()
    assert len(hashed) == 1  # read, as no etag was recorded with it


def _frozen_clock(monkeypatch, no_xattrs: bool) -> None:
    """Every write lands in the same clock tick; ``no_xattrs``: as on a filesystem without them."""
    monkeypatch.setattr(time, "time_ns", lambda: 1_700_000_000_000_000_000)
    if no_xattrs:

        def refuse(*_args, **_kwargs):
            raise OSError(errno.ENOTSUP, "Operation not supported")

        monkeypatch.setattr(os, "setxattr", refuse)


@pytest.mark.parametrize("no_xattrs", [False, True], ids=["recorded", "no-xattrs"])
def test_a_stale_etag_is_refused_after_same_size_rewrites_in_one_clock_tick(
    file_root, monkeypatch, no_xattrs
):
    _frozen_clock(monkeypatch, no_xattrs)
    store = open_storage(file_root)
    uri = f"{file_root}/runs/r/checkpoints/latest.json"
    first = store.put(uri, b'{"step": 10}')
    second = store.put(uri, b'{"step": 20}', if_match=first)
    third = store.put(uri, b'{"step": 30}', if_match=second)
    assert len({first, second, third}) == 3
    for stale in (first, second):
        with pytest.raises(PreconditionFailed, match="re-read it and retry"):
            store.put(uri, b'{"step": 99}', if_match=stale)
    assert store.get_with_etag(uri) == (b'{"step": 30}', third)
    assert store.head(uri)["etag"] == third


def test_a_file_handed_over_twice_in_one_clock_tick_gets_two_etags(file_root, tmp_path, monkeypatch):
    _frozen_clock(monkeypatch, no_xattrs=False)
    store = open_storage(file_root)
    uri, etags = f"{file_root}/ckpt/__0_0.distcp", []
    for i in range(3):
        (tmp_path / "shard").write_bytes(b"same size %d" % i)
        etags.append(store.upload_file(tmp_path / "shard", uri, move=True))
        assert store.head(uri)["etag"] == etags[-1]
    assert len(set(etags)) == 3


def test_a_file_changed_in_place_by_another_program_gets_a_new_etag(file_root, tmp_path):
    store = open_storage(file_root)
    uri, path = f"{file_root}/data/table.csv", tmp_path / "root/data/table.csv"
    before = store.put(uri, b"a,b\n1,2\n")
    with open(path, "r+b") as f:  # the same size, inode and recorded etag: only the mtime moves
        f.write(b"c,d")
    assert store.head(uri)["etag"] == hashlib.md5(b"c,d\n1,2\n").hexdigest() != before
    with open(path, "ab") as f:
        f.write(b"3,4\n")
    assert store.head(uri)["etag"] == hashlib.md5(b"c,d\n1,2\n3,4\n").hexdigest()
    with pytest.raises(PreconditionFailed):
        store.put(uri, b"a,b\n", if_match=before)


def test_without_xattrs_a_handed_over_file_has_the_etag_head_reads(file_root, tmp_path, monkeypatch):
    _frozen_clock(monkeypatch, no_xattrs=True)
    store = open_storage(file_root)
    (tmp_path / "shard").write_bytes(b"shard bytes")
    moved = store.upload_file(tmp_path / "shard", f"{file_root}/ckpt/shard", move=True)
    assert moved == store.head(f"{file_root}/ckpt/shard")["etag"] == hashlib.md5(b"shard bytes").hexdigest()


def test_deleting_a_prefix_takes_the_temp_files_of_killed_writes_and_the_folders(file_root, monkeypatch):
    """A write killed between its temp file and the rename (``kill -9``) leaves the temp file,
    which list() never shows: deleting the prefix removes it too, and then the empty folders."""
    store = open_storage(file_root)
    store.put(f"{file_root}/v/1/card.json", b"{}")

    def killed(self, tmp, path, *args):
        raise KeyboardInterrupt  # the process dies here: the temp file is written, not renamed

    monkeypatch.setattr(FileStorage, "_commit", killed)
    with pytest.raises(KeyboardInterrupt):
        store.copy(f"{file_root}/v/1/card.json", f"{file_root}/v/1/sub/model.safetensors")
    monkeypatch.undo()
    folder = file_root[len("file://") :] + "/v/1"
    assert [name for _, _, names in os.walk(folder) for name in names if ".tmp-" in name]
    assert store.list(f"{file_root}/v/1") == [f"{file_root}/v/1/card.json"]

    assert store.delete_prefix(f"{file_root}/v/1") == 1
    assert not os.path.exists(folder)
