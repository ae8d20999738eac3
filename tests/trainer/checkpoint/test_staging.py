"""What a save reuses from one save to the next: staging buffers and save plans (a world of one)."""

import pytest
import torch
import torch.distributed.checkpoint as dcp

from trainer.checkpoint.files import Written, hashing_writer
from trainer.checkpoint.staging import caching_planner, plan_key, reusing_stager
from trainer.models.llama import Transformer
from trainer.presets import PRESETS


def state(seed: int = 0) -> dict:
    torch.manual_seed(seed)
    return {"model": Transformer(PRESETS["tiny"].with_vocab(257)).state_dict()}


def pointers(staged: dict) -> dict[str, int]:
    return {name: tensor.data_ptr() for name, tensor in staged["model"].items()}


def test_the_stager_copies_into_the_same_buffers_at_every_save_and_they_hold_a_snapshot():
    live = state()
    stager = reusing_stager(cuda=False)
    first = stager.stage(live)
    first_pointers, first_values = pointers(first), {k: v.clone() for k, v in first["model"].items()}
    for name, tensor in first["model"].items():
        assert tensor.data_ptr() != live["model"][name].data_ptr(), name  # a copy, not the live weights
    with torch.no_grad():
        for tensor in live["model"].values():
            tensor.add_(1.0)  # training goes on after the stage returned
    for name, tensor in first["model"].items():
        assert torch.equal(tensor, first_values[name]), name
    second = stager.stage(live)
    assert pointers(second) == first_pointers  # the same memory, no new allocation
    for name, tensor in second["model"].items():
        assert torch.equal(tensor, live["model"][name]), name
    stager.close()


def test_a_save_with_cached_plans_sends_no_plan_once_its_state_keeps_its_shapes(world_of_one, tmp_path):
    key, live = plan_key(), state()
    for number in (1, 2):
        dcp.save(
            live,
            storage_writer=hashing_writer(tmp_path / f"save{number}", Written()),
            planner=caching_planner(key),
        )
    again = caching_planner(key)
    again.set_up_planner(live, None, True)
    assert not again.create_local_plan().usable  # the cached plan stands: nothing to gather
    other = caching_planner(plan_key())
    other.set_up_planner(live, None, True)
    assert other.create_local_plan().usable  # another checkpointer's key shares nothing

    loaded = state(seed=1)
    assert not all(torch.equal(t, live["model"][name]) for name, t in loaded["model"].items())
    dcp.load(loaded, storage_reader=dcp.FileSystemReader(tmp_path / "save2"))
    for name, tensor in loaded["model"].items():
        assert torch.equal(tensor, live["model"][name]), name


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_the_staging_buffers_are_pinned_and_reused():
    live = {"model": {k: v.cuda() for k, v in state()["model"].items()}}
    stager = reusing_stager()
    first = stager.stage(live)
    assert all(t.device.type == "cpu" and t.is_pinned() for t in first["model"].values())
    first_pointers = pointers(first)
    with torch.no_grad():
        for tensor in live["model"].values():
            tensor.mul_(2.0)
    second = stager.stage(live)
    assert pointers(second) == first_pointers
    for name, tensor in second["model"].items():
        assert torch.equal(tensor, live["model"][name].cpu()), name
    stager.close()


def test_a_torch_whose_stager_cannot_be_reused_gets_a_fresh_stager_per_save(monkeypatch, caplog):
    from trainer.checkpoint import staging

    assert staging.stager_reuse_works()  # the pinned torch (constraints.txt) has the fix
    kept = staging.SaveStagers(cuda=False)
    assert kept.reused and kept.for_save() is kept.for_save()

    class Closing(staging.DefaultStager):  # torch 2.11: every stage closes the copier
        def stage(self, state_dict, **kwargs):
            if getattr(self, "_closed_once", False):
                raise KeyError(type)
            self._closed_once = True
            return super().stage(state_dict, **kwargs)

    monkeypatch.setattr(staging, "DefaultStager", Closing)
    assert not staging.stager_reuse_works()
    with caplog.at_level("WARNING", logger="trainer.checkpoint"):
        fresh = staging.SaveStagers(cuda=False)
    assert not fresh.reused and fresh.for_save() is not fresh.for_save()
    assert "cannot reuse DCP staging buffers (pytorch/pytorch#183413)" in caplog.text
