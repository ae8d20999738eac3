"""A real save / commit / verify / load round trip on file:// (a world of one, in process)."""

import json
import logging

import pytest
import torch

from trainer import parallel
from trainer.checkpoint import Checkpointer
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
    assert json.loads((tmp_path / "run/checkpoints/latest.json").read_text()) == {"step": 15, "uri": layout.checkpoint(15)}
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
