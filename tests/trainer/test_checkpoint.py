"""A real save / commit / verify / load round trip on file:// (a world of one, in process)."""

import json
import logging
import re

import pytest
import torch

from trainer import parallel
from trainer.checkpoint import Checkpointer, CheckpointError
from trainer.contract import RunLayout
from trainer.model import Transformer
from trainer.optim import build_optimizer
from trainer.presets import PRESETS
from trainer.storage import open_storage


@pytest.fixture
def world_of_one():
    env = parallel.init_distributed()
    yield env
    parallel.shutdown()


def train_one_step(model, optimizer):
    tokens = torch.randint(0, 257, (2, 9))
    torch.nn.functional.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten()).backward()
    optimizer.step()
    optimizer.zero_grad()


def fresh(seed):
    torch.manual_seed(seed)
    model = Transformer(PRESETS["tiny"].with_vocab(257))
    return model, build_optimizer(model, lr=1e-2, weight_decay=0.1)


def test_save_commit_prune_and_load(world_of_one, tmp_path, caplog):
    run_uri = (tmp_path / "run").as_uri()
    layout, storage = RunLayout(run_uri), open_storage(run_uri)
    model, optimizer = fresh(0)
    ckpt = Checkpointer(storage, run_uri, rank=0, world_size=1, keep=2)
    saved = {}
    for step in (5, 10, 15):
        train_one_step(model, optimizer)
        ckpt.save(step, model, optimizer, {"step": step, "cursor": step * 8}, {"model": {"dim": 64}})
        saved[step] = {k: v.clone() for k, v in model.state_dict().items()}

    steps = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir() if p.is_dir())
    assert steps == ["step_00000010", "step_00000015"]  # keep=2 pruned step 5
    assert json.loads((tmp_path / "run/checkpoints/latest.json").read_text()) == {
        "step": 15,
        "uri": layout.checkpoint(15),
    }
    marker = json.loads((tmp_path / "run/checkpoints/step_00000015/_COMMITTED").read_text())
    assert (marker["step"], marker["world_size"], marker["model"]) == (15, 1, {"dim": 64})
    for entry in marker["files"]:
        assert (tmp_path / "run/checkpoints/step_00000015" / entry["name"]).stat().st_size == entry["size"]
    assert {e["name"] for e in marker["files"]} == {".metadata", "__0_0.distcp", "extra_rank0.pt"}

    other, other_opt = fresh(1)
    step, extras = ckpt.load_latest(other, other_opt)
    assert (step, extras["cursor"]) == (15, 120)
    for name, tensor in other.state_dict().items():
        assert torch.equal(tensor, saved[15][name]), name
    # the optimizer resumes too: one more identical step keeps the two models identical
    for m, opt in ((model, optimizer), (other, other_opt)):
        torch.manual_seed(3)
        train_one_step(m, opt)
    for name, tensor in other.state_dict().items():
        assert torch.equal(tensor, model.state_dict()[name]), name

    # A damaged newest checkpoint and an unfinished one are skipped, with reasons in the log.
    (tmp_path / "run/checkpoints/step_00000015/__0_0.distcp").write_bytes(b"short")
    storage.put(layout.checkpoint(20) + "/__0_0.distcp", b"partial")
    with caplog.at_level(logging.INFO, logger="trainer.checkpoint"):
        step, _ = ckpt.find_latest()
    assert step == 10
    assert "skipped step 20: no _COMMITTED marker (its save did not finish)" in caplog.text
    assert "skipped step 15: file __0_0.distcp has 5 bytes, _COMMITTED says" in caplog.text
    assert "picked step 10" in caplog.text


def test_no_checkpoint_means_a_fresh_start(world_of_one, tmp_path):
    run_uri = (tmp_path / "run").as_uri()
    model, optimizer = fresh(0)
    assert Checkpointer(open_storage(run_uri), run_uri, 0, 1, keep=1).load_latest(model, optimizer) is None


def snapshot(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_async_save_keeps_the_state_of_its_step_while_training_goes_on(world_of_one, tmp_path, caplog):
    run_uri = (tmp_path / "run").as_uri()
    model, optimizer = fresh(0)
    ckpt = Checkpointer(open_storage(run_uri), run_uri, rank=0, world_size=1, keep=3)
    train_one_step(model, optimizer)
    at_save = snapshot(model)
    with caplog.at_level(logging.INFO, logger="trainer.checkpoint"):
        blocked = ckpt.save_async(10, model, optimizer, {"step": 10, "cursor": 80})
        train_one_step(model, optimizer)  # the weights change while the save is in flight
        ckpt.save_async(20, model, optimizer, {"step": 20, "cursor": 160})  # waits for step 10 first
        assert ckpt.last_committed == 10
        assert ckpt.wait() and ckpt.last_committed == 20
    assert blocked >= 0.0
    assert re.search(
        r"checkpoint: step 10 staged in \d+\.\d\ds \(loop blocked\), after waiting \d+\.\d\ds for the previous save; committed in \d+\.\ds",
        caplog.text,
    )

    other, other_opt = fresh(1)
    (tmp_path / "run/checkpoints/step_00000020/_COMMITTED").unlink()  # fall back to step 10
    step, extras = ckpt.load_latest(other, other_opt)
    assert (step, extras["cursor"]) == (10, 80)
    for name, tensor in other.state_dict().items():
        assert torch.equal(tensor, at_save[name]), name


class FailingUploads:
    """A storage whose uploads fail, as a full disk or revoked credentials would make them."""

    def __init__(self, storage):
        self.storage = storage

    def __getattr__(self, name):
        return getattr(self.storage, name)

    def upload_file(self, path, uri, *, move=False):
        raise OSError(f"No space left on device while uploading {uri}")


def test_a_failed_background_save_is_reported_and_the_last_commit_stays(world_of_one, tmp_path):
    run_uri = (tmp_path / "run").as_uri()
    storage = open_storage(run_uri)
    model, optimizer = fresh(0)
    Checkpointer(storage, run_uri, 0, 1, keep=2).save(5, model, optimizer, {"step": 5, "cursor": 40})
    ckpt = Checkpointer(FailingUploads(storage), run_uri, 0, 1, keep=2)
    ckpt.save_async(10, model, optimizer, {"step": 10, "cursor": 80})
    with pytest.raises(
        CheckpointError,
        match=r"^the checkpoint of step 10 failed in the background "
        r"\(CheckpointError: checkpoint step 10 was not committed: rank 0: "
        r"OSError: No space left on device",
    ):
        ckpt.wait()
    assert ckpt.wait()  # reported once
    assert json.loads((tmp_path / "run/checkpoints/latest.json").read_text())["step"] == 5
    assert not (tmp_path / "run/checkpoints/step_00000010/_COMMITTED").exists()
    assert ckpt.find_latest()[0] == 5


def test_missing_shard_or_bad_checksum_is_never_loaded(world_of_one, tmp_path, caplog):
    run_uri = (tmp_path / "run").as_uri()
    model, optimizer = fresh(0)
    ckpt = Checkpointer(open_storage(run_uri), run_uri, rank=0, world_size=1, keep=5)
    for step in (10, 20, 30):
        train_one_step(model, optimizer)
        ckpt.save(step, model, optimizer, {"step": step, "cursor": step})
        if step == 10:
            at_10 = snapshot(model)
    (tmp_path / "run/checkpoints/step_00000030/__0_0.distcp").unlink()  # a shard lost
    shard = tmp_path / "run/checkpoints/step_00000020/__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, other bytes: only the checksum sees it
    shard.write_bytes(bytes(data))

    other, other_opt = fresh(1)
    with caplog.at_level(logging.INFO, logger="trainer.checkpoint"):
        step, extras = ckpt.load_latest(other, other_opt)
    assert (step, extras["cursor"]) == (10, 10)
    assert "skipped step 30: file __0_0.distcp listed in _COMMITTED is missing" in caplog.text
    assert re.search(
        r"skipped step 20: checkpoint file .*__0_0.distcp has sha256 \w+, _COMMITTED says \w+", caplog.text
    )
    for name, tensor in other.state_dict().items():
        assert torch.equal(tensor, at_10[name]), name
