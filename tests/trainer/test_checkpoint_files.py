"""Committed checkpoints as files, read by a single process: verified against ``_COMMITTED``, the
newest trustworthy one picked, downloaded with checksums, per-rank states read by name."""

import hashlib
import logging
import warnings

import pytest
import torch

from trainer.checkpoint_files import (
    CorruptCheckpoint,
    checked_marker,
    download,
    find_latest,
    load_model_weights,
    per_rank_file,
    per_rank_state_dicts,
)
from trainer.commit import commit_marker
from trainer.contract import RunLayout
from trainer.storage import open_storage


def write_checkpoint(layout, step, files: dict[str, bytes], committed=True):
    """A checkpoint folder holding ``files``, with its ``_COMMITTED`` when ``committed``."""
    storage = open_storage(layout.run_uri)
    for name, data in files.items():
        storage.put(f"{layout.checkpoint(step)}/{name}", data)
    entries = [{"name": n, "size": len(d), "sha256": hashlib.sha256(d).hexdigest()} for n, d in files.items()]
    if committed:
        storage.put_json(
            layout.committed_marker(step), commit_marker(step=step, files=entries, world_size=1, time=0.0)
        )
    return storage


def test_a_marker_is_trusted_only_when_its_files_are_there_with_their_sizes(tmp_path):
    layout = RunLayout((tmp_path / "run").as_uri())
    storage = write_checkpoint(layout, 10, {".metadata": b"m", "__0_0.distcp": b"shard"})
    marker, problem = checked_marker(storage, layout, 10)
    assert problem is None and [f["name"] for f in marker["files"]] == [".metadata", "__0_0.distcp"]
    storage.put(f"{layout.checkpoint(10)}/__0_0.distcp", b"sh")
    assert checked_marker(storage, layout, 10)[1] == "file __0_0.distcp has 2 bytes, _COMMITTED says 5"
    # a listing without a marker is enough to say so: the marker is not fetched
    assert checked_marker(storage, layout, 10, listed=False) == (
        None,
        "no _COMMITTED marker (its save did not finish)",
    )


def test_the_newest_trustworthy_checkpoint_is_picked_and_the_log_says_why_others_were_not(tmp_path, caplog):
    layout = RunLayout((tmp_path / "run").as_uri())
    storage = write_checkpoint(layout, 10, {"a": b"1"})
    write_checkpoint(layout, 20, {"a": b"2"}, committed=False)
    with caplog.at_level(logging.INFO, logger="trainer.checkpoint"):
        step, marker = find_latest(storage, layout)
    assert (step, marker["step"]) == (10, 10)
    assert "skipped step 20: no _COMMITTED marker" in caplog.text and "picked step 10" in caplog.text
    assert find_latest(storage, layout, exclude=frozenset({10})) is None
    assert find_latest(storage, RunLayout((tmp_path / "empty").as_uri())) is None


def test_a_download_is_checked_against_the_listed_sha256(tmp_path):
    layout = RunLayout((tmp_path / "run").as_uri())
    storage = write_checkpoint(layout, 5, {"a": b"first", "b": b"second"})
    marker, _ = checked_marker(storage, layout, 5)
    local = download(storage, layout, 5, marker, tmp_path / "cache")
    assert local == tmp_path / "cache" / "load" / "step_00000005"
    assert {p.name: p.read_bytes() for p in local.iterdir()} == {"a": b"first", "b": b"second"}

    storage.put(f"{layout.checkpoint(5)}/b", b"SECOND")  # same size, other bytes
    with pytest.raises(
        CorruptCheckpoint, match=r"checkpoint file .*/step_00000005/b has sha256 \w+, _COMMITTED says"
    ):
        download(storage, layout, 5, marker, tmp_path / "cache")


def test_per_rank_states_are_read_by_name_also_from_the_flat_files_of_earlier_checkpoints():
    named = {"train_state": {"step": 3, "cursor": 48, "rng": {}}, "scheduler": {"last_epoch": 3}}
    assert per_rank_state_dicts(named) is named
    flat = {
        "step": 3,
        "cursor": 48,
        "rng": {},
        "scheduler": {"last_epoch": 3},
        "scaler": None,
        "world_size": 2,
    }
    assert per_rank_state_dicts(flat) == named
    assert per_rank_state_dicts({**flat, "scaler": {"scale": 1024.0}})["scaler"] == {"scale": 1024.0}
    assert per_rank_file(3) == "extra_rank3.pt"


def test_a_plain_model_loads_the_weights_of_a_dcp_checkpoint_in_one_process(tmp_path):
    import torch.distributed.checkpoint as dcp

    from trainer.model import Transformer
    from trainer.presets import PRESETS

    args = PRESETS["tiny"].with_vocab(97)
    torch.manual_seed(0)
    trained = Transformer(args)
    with warnings.catch_warnings():  # DCP warns that there is no process group: there is none on purpose
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.save(
            {"model": trained.state_dict()},
            storage_writer=dcp.FileSystemWriter(tmp_path / "ckpt"),
            no_dist=True,
        )
    torch.manual_seed(1)
    fresh = Transformer(args)
    load_model_weights(tmp_path / "ckpt", fresh)
    for name, tensor in fresh.state_dict().items():
        assert torch.equal(tensor, trained.state_dict()[name]), name
