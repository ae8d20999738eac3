"""Fetching once per node: the first asker downloads and verifies, the others find it verified."""

import hashlib
import multiprocessing
import os
import subprocess
import sys
import textwrap

import pytest

from tests.trainer.helpers import CountingDownloads as Counting
from trainer.checkpoint import node_cache
from trainer.storage import open_storage


def stored(tmp_path, content: bytes):
    (tmp_path / "store").mkdir(exist_ok=True)
    (tmp_path / "store" / "obj").write_bytes(content)
    uri = (tmp_path / "store" / "obj").as_uri()
    return uri, hashlib.sha256(content).hexdigest()


def test_a_file_is_fetched_once_then_found_verified(tmp_path):
    uri, sha = stored(tmp_path, b"shard bytes")
    storage = Counting(open_storage(uri))
    path = tmp_path / "cache" / "a.bin"
    assert node_cache.fetch(storage, uri, path, sha256=sha, size=11) is True
    assert node_cache.fetch(storage, uri, path, sha256=sha, size=11) is False
    assert path.read_bytes() == b"shard bytes" and storage.downloads == [uri]
    assert node_cache.is_verified(path, sha, 11)
    # the folder holds the file, its sidecar and its lock: no temporary file is left
    assert sorted(p.name for p in path.parent.iterdir()) == [".a.bin.lock", ".a.bin.verified", "a.bin"]


def test_other_bytes_in_storage_are_refused_and_leave_nothing_in_place(tmp_path):
    uri, sha = stored(tmp_path, b"shard bytes")
    path = tmp_path / "cache" / "a.bin"
    with pytest.raises(node_cache.Mismatch, match=r"obj has sha256 \w+, \w+ was wanted") as bad:
        node_cache.fetch(open_storage(uri), uri, path, sha256="0" * 64)
    assert bad.value.sha256 == sha and bad.value.size == 11
    with pytest.raises(node_cache.Mismatch, match=r"obj has 11 bytes, 12 were wanted"):
        node_cache.fetch(open_storage(uri), uri, path, sha256=sha, size=12)
    assert [p.name for p in path.parent.iterdir()] == [".a.bin.lock"]


def test_with_no_checksum_known_the_size_is_verified_and_a_file_without_a_sidecar_is_fetched_again(tmp_path):
    uri, _ = stored(tmp_path, b"hf weights")
    storage = Counting(open_storage(uri))
    path = tmp_path / "cache" / "model.safetensors"
    path.parent.mkdir()
    path.write_bytes(b"hf weights")  # no sidecar: without a checksum it cannot be trusted
    assert node_cache.fetch(storage, uri, path, sha256=None, size=10) is True
    assert node_cache.fetch(storage, uri, path, sha256=None, size=10) is False
    assert storage.downloads == [uri] and node_cache.is_verified(path, None, 10)
    with pytest.raises(node_cache.Mismatch, match=r"obj has 10 bytes, 11 were wanted"):
        node_cache.fetch(storage, uri, tmp_path / "cache" / "other", sha256=None, size=11)


def test_a_file_whose_content_changed_or_lost_its_sidecar_is_checked_again(tmp_path):
    uri, sha = stored(tmp_path, b"new bytes")
    storage = Counting(open_storage(uri))
    path = tmp_path / "cache" / "a.bin"
    path.parent.mkdir()
    path.write_bytes(b"new bytes")  # as an earlier version left it: no sidecar, the right bytes
    assert node_cache.fetch(storage, uri, path, sha256=sha) is False
    assert storage.downloads == [] and node_cache.is_verified(path, sha)
    path.write_bytes(b"old bytes")  # changed behind the sidecar's back (same size)
    node_cache.sidecar(path).write_text('{"size": 9, "sha256": "stale"}')
    assert node_cache.fetch(storage, uri, path, sha256=sha) is True
    assert path.read_bytes() == b"new bytes" and storage.downloads == [uri]


def _fetch_in_child(uri, sha, path, start, results):
    start.wait()
    storage = Counting(open_storage(uri))
    node_cache.fetch(storage, uri, path, sha256=sha)
    results.put(len(storage.downloads))


def test_ranks_of_a_node_asking_at_once_download_it_once(tmp_path):
    uri, sha = stored(tmp_path, os.urandom(4 << 20))
    path = tmp_path / "cache" / "a.bin"
    ctx = multiprocessing.get_context("spawn")
    start, results = ctx.Barrier(4), ctx.Queue()
    children = [ctx.Process(target=_fetch_in_child, args=(uri, sha, path, start, results)) for _ in range(4)]
    for child in children:
        child.start()
    for child in children:
        child.join(120)
        assert child.exitcode == 0
    assert sorted(results.get(timeout=10) for _ in children) == [0, 0, 0, 1]
    assert hashlib.sha256(path.read_bytes()).hexdigest() == sha


CRASHING_FETCH = """
import os, sys
from tests.trainer.helpers import ForwardingStorage
from trainer.checkpoint import node_cache
from trainer.storage import open_storage
from pathlib import Path

class DiesMidway(ForwardingStorage):
    def download_file_hashed(self, uri, local_path):
        with open(local_path, "wb") as f:  # half the bytes, then the process is gone
            f.write(b"half")
            f.flush()
            os._exit(9)

uri, sha, path = sys.argv[1:]
node_cache.fetch(DiesMidway(open_storage(uri)), uri, Path(path), sha256=sha)
"""


def test_a_crash_mid_download_leaves_only_a_temporary_file_which_the_next_fetch_removes(tmp_path):
    uri, sha = stored(tmp_path, b"half and the rest")
    path = tmp_path / "cache" / "a.bin"
    child = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(CRASHING_FETCH), uri, sha, str(path)],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        capture_output=True,
        timeout=60,
    )
    assert child.returncode == 9, child.stderr
    left = sorted(p.name for p in path.parent.iterdir())
    assert left[0] == ".a.bin.lock" and left[1].startswith(".a.bin.part-") and len(left) == 2
    assert not node_cache.is_verified(path, sha)
    # the lock died with the process: the next rank takes it, fetches, and sweeps the remains
    assert node_cache.fetch(open_storage(uri), uri, path, sha256=sha) is True
    assert sorted(p.name for p in path.parent.iterdir()) == [".a.bin.lock", ".a.bin.verified", "a.bin"]
    assert path.read_bytes() == b"half and the rest"


def test_a_file_written_in_place_after_it_was_verified_is_fetched_again(tmp_path):
    # A checkpoint file in the node-local tier can share its inode with the one in file://
    # storage (a hard link): a write into either, keeping the size, must not pass as verified.
    uri, sha = stored(tmp_path, b"shard bytes")
    path = tmp_path / "cache" / "a.bin"
    path.parent.mkdir()
    path.write_bytes(b"shard bytes")
    node_cache.record_verified(path, 11, sha)
    assert node_cache.is_verified(path, sha, 11)
    storage = Counting(open_storage(uri))
    assert node_cache.fetch(storage, uri, path, sha256=sha, size=11) is False and storage.downloads == []
    stat = path.stat()
    with open(path, "r+b") as f:  # in place: same inode, same size, other bytes
        f.write(b"SHARD")
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))  # coarse clocks: make it move
    assert not node_cache.is_verified(path, sha, 11)
    assert node_cache.fetch(storage, uri, path, sha256=sha, size=11) is True
    assert path.read_bytes() == b"shard bytes" and storage.downloads == [uri]
