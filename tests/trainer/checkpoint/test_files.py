"""Committed checkpoints as files, read by a single process: verified against ``_COMMITTED``, the
newest trustworthy one picked, downloaded with checksums, per-rank states read by name."""

import hashlib
import logging
import warnings

import pytest
import torch

from trainer.checkpoint.commit import commit_marker
from trainer.checkpoint.fence import raised
from trainer.checkpoint.files import (
    CorruptCheckpoint,
    Written,
    checked_marker,
    download,
    find_latest,
    hashing_open,
    hashing_writer,
    load_model_weights,
    nothing_to_resume,
    per_rank_file,
    per_rank_state_dicts,
    survey,
)
from trainer.contract import RunLayout
from trainer.storage import open_storage


def write_checkpoint(layout, step, files: dict[str, bytes], committed=True, attempt=None):
    """A checkpoint folder holding ``files``, with its ``_COMMITTED`` when ``committed``; with an
    ``attempt``, the files go to its folder (as the trainer writes them), else to the step's."""
    storage = open_storage(layout.run_uri)
    folder = layout.checkpoint(step) if attempt is None else layout.checkpoint_files(step, attempt)
    for name, data in files.items():
        storage.put(f"{folder}/{name}", data)
    entries = [{"name": n, "size": len(d), "sha256": hashlib.sha256(d).hexdigest()} for n, d in files.items()]
    if committed:
        storage.put_json(
            layout.committed_marker(step),
            commit_marker(step=step, files=entries, world_size=1, time=0.0, attempt=attempt),
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
    assert find_latest(storage, RunLayout((tmp_path / "empty").as_uri())) is None


def test_a_survey_tells_a_fresh_run_from_one_whose_checkpoints_all_failed(tmp_path):
    layout = RunLayout((tmp_path / "run").as_uri())
    storage = write_checkpoint(layout, 20, {"a": b"2"}, committed=False)  # an interrupted first save
    found = survey(storage, layout)
    assert (found.picked, found.ever_committed) == (None, False)  # nothing was committed: start fresh
    write_checkpoint(layout, 10, {"a": b"1"}, attempt=1)
    storage.put(f"{layout.checkpoint_files(10, 1)}/a", b"12")
    found = survey(storage, layout, corrupt={})
    assert found.picked is None and found.ever_committed
    assert found.refused == (
        (20, "no _COMMITTED marker (its save did not finish)"),
        (10, "file a has 2 bytes, _COMMITTED says 1"),
    )
    message = nothing_to_resume(layout, found)
    assert message == (
        f"checkpoints were committed under {layout.checkpoints} but none can be resumed (step 20: no "
        "_COMMITTED marker (its save did not finish); step 10: file a has 2 bytes, _COMMITTED says 1); "
        "refusing to start over from step 0: restore the damaged files, delete the _COMMITTED of each bad "
        "checkpoint to fall back to an older one (delete them all, and latest.json, to start from step 0), "
        "or start the run under a new run prefix"
    )
    # a checksum found bad on download is passed over with its reason
    storage.put(f"{layout.checkpoint_files(10, 1)}/a", b"1")
    assert survey(storage, layout).picked[0] == 10
    assert survey(storage, layout, corrupt={10: "sha256 differs"}).refused[-1] == (10, "sha256 differs")


def test_latest_json_naming_a_step_counts_as_committed_even_with_no_folder_left(tmp_path):
    layout = RunLayout((tmp_path / "run").as_uri())
    storage = open_storage(layout.run_uri)
    storage.put_json(layout.latest, {"step": 40, "uri": layout.checkpoint(40)})
    found = survey(storage, layout)
    assert found.picked is None and found.ever_committed and found.refused == ()
    assert "(latest.json names a committed step, but no step folder holds a _COMMITTED)" in nothing_to_resume(
        layout, found
    )
    storage.put_json(layout.latest, raised(None, 1, 0))  # a fence alone is no commit
    assert not survey(storage, layout).ever_committed


def test_a_marker_the_fence_voids_is_passed_over_and_is_no_commit(tmp_path):
    layout = RunLayout((tmp_path / "run").as_uri())
    storage = write_checkpoint(layout, 10, {"a": b"1"}, attempt=1)
    storage.put_json(layout.latest, raised({"step": 10, "uri": layout.checkpoint(10)}, 2, 10))
    write_checkpoint(layout, 20, {"a": b"2"}, attempt=1)  # a zombie's, after attempt 2 started
    found = survey(storage, layout)
    assert found.picked[0] == 10
    assert found.refused[0][0] == 20 and found.refused[0][1].startswith(
        "committed by attempt 1 after attempt 2"
    )
    assert checked_marker(storage, layout, 20)[1] is None  # without the fence it would look fine

    only_zombie = RunLayout((tmp_path / "run2").as_uri())
    storage.put_json(only_zombie.latest, raised(None, 2, 0))
    write_checkpoint(only_zombie, 5, {"a": b"1"}, attempt=1)
    assert not survey(storage, only_zombie).ever_committed  # a fresh start is right: nothing was committed


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

    write_checkpoint(layout, 6, {"a": b"in its attempt's folder"}, attempt=2)
    marker, problem = checked_marker(storage, layout, 6)
    assert problem is None
    local = download(storage, layout, 6, marker, tmp_path / "cache")
    assert (local / "a").read_bytes() == b"in its attempt's folder"


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

    from trainer.models.llama import Transformer
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


def test_dcp_files_are_checksummed_as_they_are_written(tmp_path):
    import torch.distributed.checkpoint as dcp

    written = Written()
    state = {"model": {"w": torch.arange(1000, dtype=torch.float32), "b": torch.ones(7)}, "step": 3}
    with warnings.catch_warnings():  # no process group on purpose
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.save(state, storage_writer=hashing_writer(tmp_path / "ckpt", written), no_dist=True)
    names = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    assert ".metadata" in names and any(n.endswith(".distcp") for n in names)
    for name in names:  # .metadata too, though DCP writes it under another name and renames it
        data = (tmp_path / "ckpt" / name).read_bytes()
        assert written.get(name) == (len(data), hashlib.sha256(data).hexdigest()), name
    assert written.get(".metadata.tmp") is None


def test_a_hashing_file_counts_what_it_writes_and_cannot_seek(tmp_path):
    written = Written()
    with hashing_open(tmp_path / "f.bin", written) as f:
        assert f.write(b"abc") == 3 and f.write(memoryview(b"defg")) == 4
        assert f.tell() == 7 and not f.seekable()
        with pytest.raises(OSError):
            f.seek(0)
        assert written.get("f.bin") is None  # recorded when it closes
    assert written.get("f.bin") == (7, hashlib.sha256(b"abcdefg").hexdigest())
    assert (tmp_path / "f.bin").read_bytes() == b"abcdefg"


def test_the_checkpoint_filesystem_reads_as_dcp_does_and_writes_files_only_whole(tmp_path):
    from trainer.checkpoint.files import _HashingFileSystem

    fs = _HashingFileSystem(Written())
    with fs.create_stream(tmp_path / "f", "wb") as f:
        f.write(b"abc")
    with fs.create_stream(tmp_path / "f", "rb") as f:
        assert f.read() == b"abc"
    appending = fs.create_stream(tmp_path / "f", "ab")
    with pytest.raises(ValueError, match=r"written whole \(mode 'wb'\), not opened with mode 'ab'"):
        appending.__enter__()
    fs.rename(tmp_path / "f", tmp_path / "g")
    assert fs.written.get("g") == (3, hashlib.sha256(b"abc").hexdigest()) and fs.written.get("f") is None
