"""What each rank of a resume reads: the files its load plan needs, fetched once per node, the
small remainder sent by another rank."""

import io
import json
import subprocess
import sys

import pytest
import torch

from tests.trainer.helpers import REPO, trainer_env
from trainer.checkpoint.reads import RelayedFile, assign_reads

MIB = 1024 * 1024


def test_a_rank_fetches_the_files_it_reads_much_of_and_is_sent_the_rest():
    # the same mesh: each rank reads its own writer's file, and rank 0 some small items of rank 1's
    needs = [
        {"__0_0.distcp": [(0, 3 * MIB)], "__1_0.distcp": [(3 * MIB, 4096), (3 * MIB + 4096, 100)]},
        {"__1_0.distcp": [(0, 3 * MIB + 4196)]},
    ]
    plan = assign_reads(needs)
    assert plan.fetchers == {"__0_0.distcp": (0,), "__1_0.distcp": (1,)}
    assert plan.fetched_by(0) == ["__0_0.distcp"] and plan.fetched_by(1) == ["__1_0.distcp"]
    assert plan.relayed_to(0, needs) == {"__1_0.distcp": ((3 * MIB, 4096), (3 * MIB + 4096, 100))}
    assert plan.relayed_to(1, needs) == {}
    assert plan.to_send(1, needs) == {"__1_0.distcp": ((3 * MIB, 4096), (3 * MIB + 4096, 100))}
    assert plan.to_send(0, needs) == {}


def test_a_file_no_rank_reads_much_of_is_fetched_by_the_lowest_reader_and_sent_to_the_others():
    needs = [{}, {"__0_0.distcp": [(0, 10)]}, {"__0_0.distcp": [(10, 10)]}, {"__0_0.distcp": [(0, 10)]}]
    plan = assign_reads(needs)
    assert plan.fetchers == {"__0_0.distcp": (1,)} and plan.source == {"__0_0.distcp": 1}
    assert plan.relayed_to(2, needs) == {"__0_0.distcp": ((10, 10),)}
    assert plan.to_send(1, needs) == {"__0_0.distcp": ((0, 10), (10, 10))}
    # a reshard onto fewer ranks: every rank reads much of several files, and fetches them all
    fewer = [{"__0_0.distcp": [(0, 2 * MIB)], "__1_0.distcp": [(0, 2 * MIB)]}]
    assert assign_reads(fewer).fetched_by(0) == ["__0_0.distcp", "__1_0.distcp"]


def test_a_relayed_file_serves_its_ranges_and_refuses_any_other_byte():
    stream = RelayedFile("__1_0.distcp", {(100, 4): b"abcd", (200, 2): b"xy"})
    stream.seek(101)
    assert stream.read(3) == b"bcd"
    stream.seek(200)
    assert io.BufferedReader(stream).read(2) == b"xy"
    stream.seek(104)
    with pytest.raises(OSError, match=r"byte 104 of checkpoint file __1_0\.distcp was not relayed"):
        stream.read(1)
    stream.seek(50)
    with pytest.raises(OSError, match=r"byte 50 of checkpoint file __1_0\.distcp was not relayed"):
        stream.read(1)


def probe(tmp_path, mode, nproc, per_node, run_uri):
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"),
            *(str(REPO / "tests/trainer/load_probe.py"), mode, run_uri, str(tmp_path), str(per_node)),
        ],
        env=trainer_env(tmp_path / f"cache-{mode}-{nproc}", attempt=1),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"{mode}_{r}.json").read_text()) for r in range(nproc)]
    return ranks, torch.load(tmp_path / f"{mode}.pt", weights_only=False)


def assert_same(a, b, where=""):
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            assert_same(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b), where
    else:
        assert a == b, where


@pytest.mark.slow
def test_each_node_fetches_its_share_once_and_a_reshard_still_loads_every_byte(tmp_path):
    run_uri = (tmp_path / "run").as_uri()
    _, saved = probe(tmp_path, "save", 2, 1, run_uri)
    marker = json.loads((tmp_path / "run/checkpoints/step_00000001/_COMMITTED").read_text())
    size = sum(entry["size"] for entry in marker["files"])
    metadata = next(entry["size"] for entry in marker["files"] if entry["name"] == ".metadata")

    # the mesh it was saved on, as 2 nodes of 1 rank: each node fetches its rank's files and the
    # .metadata; the few items DCP stored once for both (in the other rank's file) are sent
    ranks, loaded = probe(tmp_path, "load", 2, 1, run_uri)
    assert sum(r["downloaded"] for r in ranks) == size + metadata  # was 2 x size
    assert all((r["step"], r["cursor"]) == (1, 8) for r in ranks)
    assert_same(saved, loaded)

    # 4 ranks on 2 nodes of 2 (a reshard): every node still fetches a file at most once
    ranks, loaded = probe(tmp_path, "load", 4, 2, run_uri)
    assert sum(r["downloaded"] for r in ranks) <= 2 * size
    assert all((r["step"], r["cursor"]) == (1, 8) for r in ranks)
    assert_same(saved, loaded)
    # the node caches keep the loaded checkpoint's files as their local tier, and nothing else
    kept = list((tmp_path / "cache-load-4").rglob("*.distcp"))
    assert kept and {p.parent.parent.name for p in kept} == {"step_00000001"}
