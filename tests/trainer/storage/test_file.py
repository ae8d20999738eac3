"""``file://`` storage: conditional writes hold across processes; paths must be absolute."""

from __future__ import annotations

import multiprocessing
import os

import pytest

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
