"""The node-local tier: a save's files stay on the node, verified once committed."""

import hashlib
import socket
from pathlib import Path

from trainer.checkpoint import local_tier, node_cache
from trainer.checkpoint.files import Written


def staged(folder, **files: bytes):
    folder.mkdir(parents=True, exist_ok=True)
    written = Written()
    for name, content in files.items():
        (folder / name).write_bytes(content)
        written.record(folder / name, len(content), hashlib.sha256(content).hexdigest())
    return [folder / name for name in files], written


def test_a_committed_save_leaves_its_files_verified_on_the_node_and_an_older_one_goes(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINOPS_CACHE_DIR", str(tmp_path / "cache"))
    run = "s3://bucket/runs/a"
    older = local_tier.folder(run, 10, 1)
    paths, written = staged(tmp_path / "save", **{"__0_0.distcp": b"shard", "extra_rank0.pt": b"state"})
    kept = local_tier.keep(paths, local_tier.folder(run, 20, 1))
    older.mkdir(parents=True)
    for path in paths:  # the upload takes the staged names away; the tier's links stay
        path.unlink()
    local_tier.committed(kept, written)
    assert local_tier.prune(run, 20) == [10]
    folder = local_tier.folder(run, 20, 1)
    assert (folder / "__0_0.distcp").read_bytes() == b"shard"
    assert node_cache.is_verified(folder / "__0_0.distcp", hashlib.sha256(b"shard").hexdigest(), 5)
    assert not older.exists()
    assert local_tier.folder(run, 20, 1) != local_tier.folder("s3://bucket/runs/b", 20, 1)  # runs never share


def test_an_uncommitted_save_leaves_nothing_in_the_tier(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINOPS_CACHE_DIR", str(tmp_path / "cache"))
    paths, _ = staged(tmp_path / "save", **{"__0_0.distcp": b"shard"})
    kept = local_tier.keep(paths, local_tier.folder("file:///r", 20, 2))
    local_tier.dropped(kept)
    assert list(kept.folder.iterdir()) == []


def test_a_rerun_of_the_same_step_replaces_what_an_uncommitted_one_left(tmp_path, monkeypatch):
    # a worker killed between its link and the commit left a file without a sidecar
    monkeypatch.setenv("TRAINOPS_CACHE_DIR", str(tmp_path / "cache"))
    folder = local_tier.folder("file:///r", 20, 2)
    folder.mkdir(parents=True)
    (folder / "__0_0.distcp").write_bytes(b"old bytes")
    paths, written = staged(tmp_path / "save", **{"__0_0.distcp": b"new"})
    local_tier.committed(local_tier.keep(paths, folder), written)
    assert (folder / "__0_0.distcp").read_bytes() == b"new"
    assert node_cache.is_verified(folder / "__0_0.distcp", hashlib.sha256(b"new").hexdigest(), 3)


def test_restored_files_count_once_per_node_local_unless_a_rank_of_the_node_downloaded_them():
    touched = [
        ("/node-0/cache", [".metadata", "__0_0.distcp", "extra_rank0.pt"], []),
        ("/node-0/cache", [".metadata", "__1_0.distcp", "extra_rank1.pt"], []),
        ("/node-1/cache", [".metadata", "__2_0.distcp", "extra_rank2.pt"], [".metadata", "__2_0.distcp"]),
    ]
    assert local_tier.restore_files(touched) == {"local": 6, "storage": 2}


def test_a_node_is_told_by_its_host_and_its_cache_as_pods_share_the_cache_path(monkeypatch):
    cache = Path("/var/cache/trainops")  # every pod's, on a cluster
    monkeypatch.setattr(socket, "gethostname", lambda: "train-0123abcd-a1-0")
    pod_0 = local_tier.node_key(cache)
    monkeypatch.setattr(socket, "gethostname", lambda: "train-0123abcd-a1-1")
    pod_1 = local_tier.node_key(cache)
    assert pod_0 != pod_1 and pod_1 != local_tier.node_key(Path("/tmp/node-1"))  # local nodes: the cache
    # so a file node 0 held and node 1 downloaded counts once from each tier, not once in all
    touched = [
        (pod_0, ["__0_0.distcp", ".metadata"], []),
        (pod_1, ["__1_0.distcp", ".metadata"], [".metadata"]),
    ]
    assert local_tier.restore_files(touched) == {"local": 3, "storage": 1}


def test_a_tier_that_cannot_be_written_leaves_the_save_to_storage_alone(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("TRAINOPS_CACHE_DIR", str(tmp_path / "cache"))
    paths, _ = staged(tmp_path / "save", **{"__0_0.distcp": b"shard", "__1_0.distcp": b"other"})
    folder = local_tier.folder("file:///r", 20, 2)
    folder.mkdir(parents=True)
    (folder / "__0_0.distcp").mkdir()  # a folder where a file goes: unlink fails (EISDIR)
    kept = local_tier.keep(paths, folder)
    assert kept.names == ["__1_0.distcp"] and all(p.exists() for p in paths)  # the save's own files stay

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    other = local_tier.folder("file:///r", 30, 2)
    monkeypatch.setattr(Path, "mkdir", full)
    kept = local_tier.keep(paths, other)
    assert kept.names == [] and "the node-local tier is unavailable ([Errno 28] No space left" in caplog.text
    local_tier.dropped(kept)  # nothing to drop
