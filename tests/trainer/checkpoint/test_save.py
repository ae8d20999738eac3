"""A real save / commit / verify / load round trip on file:// (a world of one, in process)."""

import gc
import hashlib
import json
import logging
import re
import threading
from pathlib import Path

import pytest
import torch

from tests.trainer.storage.reads import count_reads, has_user_xattrs
from trainer.checkpoint.files import Written, find_latest, hashing_open
from trainer.checkpoint.save import (
    Blocked,
    Checkpointer,
    CheckpointError,
    back_pressure_warning,
    keep_up_every_steps,
    written_entry,
)
from trainer.contract import RunLayout
from trainer.models.llama import Transformer
from trainer.optim import build_optimizer
from trainer.presets import PRESETS
from trainer.state import ModelState, OptimizerState, TrainState
from trainer.storage import open_storage


def train_one_step(model, optimizer):
    tokens = torch.randint(0, 257, (2, 9))
    torch.nn.functional.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten()).backward()
    optimizer.step()
    optimizer.zero_grad()


def fresh(seed):
    torch.manual_seed(seed)
    model = Transformer(PRESETS["tiny"].with_vocab(257))
    return model, build_optimizer(model, lr=1e-2, weight_decay=0.1)


def checkpointer(storage, run_uri, model, optimizer, keep, meta=None, hold_for_eval=(0, 0)):
    """A Checkpointer owning the model, its optimizer and a train state; (checkpointer, state)."""
    state = TrainState(torch.device("cpu"))
    states = {"model": ModelState(model), "optim": OptimizerState(model, optimizer), "train_state": state}
    saver = Checkpointer(
        storage,
        run_uri,
        rank=0,
        world_size=1,
        keep=keep,
        states=states,
        meta=meta,
        hold_for_eval=hold_for_eval,
    )
    return saver, state


def advance(state, step, cursor):
    state.step, state.cursor = step, cursor


@pytest.mark.slow
def test_save_commit_prune_and_load(world_of_one, tmp_path, caplog):
    run_uri = (tmp_path / "run").as_uri()
    layout, storage = RunLayout(run_uri), open_storage(run_uri)
    model, optimizer = fresh(0)
    ckpt, state = checkpointer(storage, run_uri, model, optimizer, keep=2, meta={"model": {"dim": 64}})
    saved = {}
    for step in (5, 10, 15):
        train_one_step(model, optimizer)
        advance(state, step, step * 8)
        ckpt.save(step)
        saved[step] = {k: v.clone() for k, v in model.state_dict().items()}

    steps = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir() if p.is_dir())
    assert steps == ["step_00000010", "step_00000015"]  # keep=2 pruned step 5
    assert json.loads((tmp_path / "run/checkpoints/latest.json").read_text()) == {
        "step": 15,
        "uri": layout.checkpoint(15),
        "attempt": 1,
    }
    marker = json.loads((tmp_path / "run/checkpoints/step_00000015/_COMMITTED").read_text())
    assert (marker["step"], marker["world_size"], marker["model"], marker["cursor"]) == (
        15,
        1,
        {"dim": 64},
        120,
    )
    # the files sit in the attempt's own folder of the step, which the marker names
    assert (marker["attempt"], marker["dir"]) == (1, "attempt_1")
    for entry in marker["files"]:
        path = tmp_path / "run/checkpoints/step_00000015/attempt_1" / entry["name"]
        assert path.stat().st_size == entry["size"]
    assert {e["name"] for e in marker["files"]} == {".metadata", "__0_0.distcp", "extra_rank0.pt"}

    other, other_opt = fresh(1)
    loader, loaded = checkpointer(storage, run_uri, other, other_opt, keep=2)
    step = loader.load_latest()
    assert (step, loaded.step, loaded.cursor) == (15, 15, 120)
    for name, tensor in other.state_dict().items():
        assert torch.equal(tensor, saved[15][name]), name
    # the optimizer resumes too: one more identical step keeps the two models identical
    for m, opt in ((model, optimizer), (other, other_opt)):
        torch.manual_seed(3)
        train_one_step(m, opt)
    for name, tensor in other.state_dict().items():
        assert torch.equal(tensor, model.state_dict()[name]), name

    # A damaged newest checkpoint and an unfinished one are skipped, with reasons in the log.
    (tmp_path / "run/checkpoints/step_00000015/attempt_1/__0_0.distcp").write_bytes(b"short")
    storage.put(layout.checkpoint(20) + "/__0_0.distcp", b"partial")
    with caplog.at_level(logging.INFO, logger="trainer.checkpoint"):
        step, _ = find_latest(storage, layout)
    assert step == 10
    assert "skipped step 20: no _COMMITTED marker (its save did not finish)" in caplog.text
    assert "skipped step 15: file __0_0.distcp has 5 bytes, _COMMITTED says" in caplog.text
    assert "picked step 10" in caplog.text


@pytest.mark.slow
def test_a_checkpoint_awaiting_its_mid_run_evaluation_is_kept_until_scored(world_of_one, tmp_path, caplog):
    # every 5 steps, every 2nd checkpoint scored: 10 and 20 are due; keep=1 would prune both.
    run_uri = (tmp_path / "run").as_uri()
    layout, storage = RunLayout(run_uri), open_storage(run_uri)
    model, optimizer = fresh(0)
    ckpt, state = checkpointer(storage, run_uri, model, optimizer, keep=1, hold_for_eval=(5, 2))

    def kept():
        return sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir() if p.is_dir())

    with caplog.at_level(logging.INFO, logger="trainer.checkpoint"):
        for step in (5, 10, 15):
            advance(state, step, step)
            ckpt.save(step)
    assert kept() == ["step_00000010", "step_00000015"]  # 5 pruned, 10 awaits its score
    assert "keeping step(s) [10] until their mid-run evaluation is written" in caplog.text
    storage.put_json(layout.checkpoint_score(10), {"skipped": "test"})  # scored (or given up)
    for step in (20, 25):
        advance(state, step, step)
        ckpt.save(step)
    assert kept() == ["step_00000020", "step_00000025"]


@pytest.mark.slow
def test_a_run_nobody_scores_keeps_only_the_newest_checkpoints_awaiting_a_score(
    world_of_one, tmp_path, caplog, monkeypatch
):
    monkeypatch.setattr("trainer.checkpoint.save.MAX_HELD_FOR_EVAL", 1)
    run_uri = (tmp_path / "run").as_uri()
    model, optimizer = fresh(0)
    ckpt, state = checkpointer(open_storage(run_uri), run_uri, model, optimizer, keep=1, hold_for_eval=(5, 1))
    with caplog.at_level(logging.INFO, logger="trainer.checkpoint"):
        for step in (5, 10, 15):
            advance(state, step, step)
            ckpt.save(step)
    kept = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir() if p.is_dir())
    assert kept == ["step_00000010", "step_00000015"]  # 5 let go: only the newest 1 is held
    assert "2 checkpoints await their mid-run evaluation; only the newest 1 are kept" in caplog.text


def test_no_checkpoint_means_a_fresh_start(world_of_one, tmp_path):
    run_uri = (tmp_path / "run").as_uri()
    model, optimizer = fresh(0)
    ckpt, state = checkpointer(open_storage(run_uri), run_uri, model, optimizer, keep=1)
    assert ckpt.load_latest() is None
    assert (state.step, state.cursor) == (0, 0)


def gloo_loops() -> int:
    """gloo's TCP loop threads in this process: one per gloo group alive (collected first: the
    groups of earlier tests' checkpointers end with them)."""
    gc.collect()
    names = (task / "comm" for task in Path("/proc/self/task").iterdir())
    return sum(1 for name in names if name.exists() and name.read_text().strip() == "gloo_tcp_loop")


@pytest.mark.slow
def test_a_checkpointer_adds_no_thread_until_it_first_saves(world_of_one, tmp_path):
    """Its gloo group's TCP loop wakes every 10 ms even when idle, preempting the training
    threads of a small CPU host: a run that does not save while it trains must not pay for it."""
    run_uri = (tmp_path / "run").as_uri()
    model, optimizer = fresh(0)
    before = gloo_loops()
    ckpt, state = checkpointer(open_storage(run_uri), run_uri, model, optimizer, keep=1)
    assert ckpt.load_latest() is None  # nothing committed: nothing for the ranks to agree on
    assert gloo_loops() == before
    advance(state, 5, 40)
    ckpt.save(5)
    assert gloo_loops() == before + 1  # the group now exists, and the save went through it
    loader, loaded = checkpointer(open_storage(run_uri), run_uri, *fresh(1), keep=1)
    assert (loader.load_latest(), loaded.cursor) == (5, 40)


def snapshot(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.slow
def test_async_save_keeps_the_state_of_its_step_while_training_goes_on(world_of_one, tmp_path, caplog):
    run_uri = (tmp_path / "run").as_uri()
    model, optimizer = fresh(0)
    ckpt, state = checkpointer(open_storage(run_uri), run_uri, model, optimizer, keep=3)
    train_one_step(model, optimizer)
    at_save = snapshot(model)
    with caplog.at_level(logging.INFO, logger="trainer.checkpoint"):
        advance(state, 10, 80)
        blocked = ckpt.save_async(10)
        train_one_step(model, optimizer)  # the weights change while the save is in flight
        advance(state, 20, 160)
        ckpt.save_async(20)  # waits for step 10 first
        assert ckpt.last_committed == 10
        assert ckpt.wait() and ckpt.last_committed == 20
    assert isinstance(blocked, Blocked) and blocked.staged_s > 0.0
    assert blocked.total_s == blocked.waited_s + blocked.staged_s
    assert re.search(
        r"checkpoint: step 10 staged in \d+\.\d\ds \(loop blocked\), after waiting \d+\.\d\ds for the previous save; committed in \d+\.\ds",
        caplog.text,
    )

    other, other_opt = fresh(1)
    (tmp_path / "run/checkpoints/step_00000020/_COMMITTED").unlink()  # fall back to step 10
    loader, loaded = checkpointer(open_storage(run_uri), run_uri, other, other_opt, keep=3)
    assert (loader.load_latest(), loaded.cursor) == (10, 80)
    for name, tensor in other.state_dict().items():
        assert torch.equal(tensor, at_save[name]), name


class HeldSaves:
    """Holds each background save's upload until the loop waits for that save, as storage that
    takes a checkpoint slower than ``checkpoint.every_steps`` steps train would: the next save
    then finds it still in flight, every time and without a race."""

    def __init__(self, ckpt: Checkpointer):
        self.storage, self.released = ckpt.storage, threading.Semaphore(0)
        ckpt.storage = self
        wait = ckpt.wait

        def waiting(timeout=None):
            if ckpt._thread is not None and ckpt._thread.is_alive():
                self.released.release()
            return wait(timeout)

        ckpt.wait = waiting

    def __getattr__(self, name):
        return getattr(self.storage, name)

    def upload_file(self, path, uri, *, move=False):
        held = threading.current_thread() is not threading.main_thread() and Path(path).name == ".metadata"
        if held and not self.released.acquire(timeout=60):
            raise TimeoutError(f"nothing waited for the save uploading {uri} within 60 s")
        return self.storage.upload_file(path, uri, move=move)


@pytest.mark.slow
def test_a_save_that_waits_for_the_previous_one_counts_the_wait_and_warns_once(
    world_of_one, tmp_path, caplog
):
    run_uri = (tmp_path / "run").as_uri()
    model, optimizer = fresh(0)
    ckpt, state = checkpointer(open_storage(run_uri), run_uri, model, optimizer, keep=3)
    HeldSaves(ckpt)
    with caplog.at_level(logging.INFO, logger="trainer.checkpoint"):
        advance(state, 4, 32)
        first = ckpt.save_async(4)
        blocked = []
        for step in (8, 12):
            train_one_step(model, optimizer)
            advance(state, step, step * 8)
            blocked.append(ckpt.save_async(step))  # step 4's (then 8's) save is still held
        assert ckpt.wait() and ckpt.last_committed == 12
    assert first.waited_s == 0.0
    for save in blocked:
        assert save.waited_s > 0.0 and save.total_s > save.waited_s
    assert (ckpt.waits, ckpt.worst_blocked) == (2, max([first, *blocked], key=lambda b: b.total_s))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings  # once, not at every save
    assert re.fullmatch(
        r"checkpoint: the save of step 8 had to wait for the save of step 4, which ran \d+\.\ds in the "
        r"background while 4 steps of training took \d+\.\ds: storage takes a checkpoint slower than "
        r"checkpoint.every_steps steps train, so the loop stalls at every save; set "
        r"checkpoint.every_steps to at least \d+, or use faster storage \(logged once; each save's "
        r"wait is in the run's metrics as checkpoint_waited_s\)",
        warnings[0],
    )
    assert find_latest(open_storage(run_uri), RunLayout(run_uri))[0] == 12


def test_the_warning_names_the_interval_at_which_storage_keeps_up():
    assert keep_up_every_steps(save_s=25.0, steps=4, loop_s=10.0) == 10  # 2.5 s a step
    assert keep_up_every_steps(save_s=10.01, steps=4, loop_s=10.0) == 5  # just slower: one more
    assert keep_up_every_steps(save_s=3.0, steps=0, loop_s=0.0) == 1
    assert "set checkpoint.every_steps to at least 10," in back_pressure_warning(8, 4, 25.0, 10.0)


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
    good, state = checkpointer(storage, run_uri, model, optimizer, keep=2)
    advance(state, 5, 40)
    good.save(5)
    ckpt, state = checkpointer(FailingUploads(storage), run_uri, model, optimizer, keep=2)
    advance(state, 10, 80)
    ckpt.save_async(10)
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
    assert find_latest(storage, RunLayout(run_uri))[0] == 5


def test_missing_shard_or_bad_checksum_is_never_loaded(world_of_one, tmp_path, caplog):
    run_uri = (tmp_path / "run").as_uri()
    model, optimizer = fresh(0)
    ckpt, state = checkpointer(open_storage(run_uri), run_uri, model, optimizer, keep=5)
    for step in (10, 20, 30):
        train_one_step(model, optimizer)
        advance(state, step, step)
        ckpt.save(step)
        if step == 10:
            at_10 = snapshot(model)
    (tmp_path / "run/checkpoints/step_00000030/attempt_1/__0_0.distcp").unlink()  # a shard lost
    shard = tmp_path / "run/checkpoints/step_00000020/attempt_1/__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, other bytes: only the checksum sees it
    shard.write_bytes(bytes(data))

    other, other_opt = fresh(1)
    loader, loaded = checkpointer(open_storage(run_uri), run_uri, other, other_opt, keep=5)
    with caplog.at_level(logging.INFO, logger="trainer.checkpoint"):
        step = loader.load_latest()
    assert (step, loaded.cursor) == (10, 10)
    assert "skipped step 30: file __0_0.distcp listed in _COMMITTED is missing" in caplog.text
    assert re.search(
        r"skipped step 20: checkpoint file .*__0_0.distcp has sha256 \w+, _COMMITTED says \w+", caplog.text
    )
    for name, tensor in other.state_dict().items():
        assert torch.equal(tensor, at_10[name]), name


def write_checkpoint_before_named_states(tmp_path, run_uri, step, model, optimizer, extras, meta):
    """A checkpoint as the trainer wrote them before the Checkpointer owned its states: DCP's
    ``{"model", "optim"}`` and one flat ``extra_rank0.pt``, then ``_COMMITTED`` and ``latest.json``."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    from trainer.checkpoint import commit
    from trainer.storage import sha256_file

    layout, storage = RunLayout(run_uri), open_storage(run_uri)
    staging = tmp_path / "legacy"
    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.save({"model": model_sd, "optim": optim_sd}, storage_writer=dcp.FileSystemWriter(staging))
    torch.save(extras, staging / "extra_rank0.pt")
    files = []
    for path in sorted(staging.iterdir()):
        files.append({"name": path.name, "size": path.stat().st_size, "sha256": sha256_file(path)})
        storage.upload_file(path, f"{layout.checkpoint(step)}/{path.name}")
    marker = commit.commit_marker(step=step, files=files, world_size=1, time=0.0, **meta)
    storage.put_json(layout.committed_marker(step), marker)
    storage.put_json(layout.latest, {"step": step, "uri": layout.checkpoint(step)})


@pytest.mark.slow
def test_a_checkpoint_written_before_the_states_had_names_still_resumes(world_of_one, tmp_path):
    from trainer.optim import build_scheduler
    from trainer.state import checkpoint_states

    run_uri = (tmp_path / "run").as_uri()
    model, optimizer = fresh(0)
    scheduler = build_scheduler(optimizer, warmup_steps=4, max_steps=20, min_lr_ratio=0.1)
    for _ in range(3):
        train_one_step(model, optimizer)
        scheduler.step()
    torch.manual_seed(11)
    rng = torch.get_rng_state()
    next_draw = torch.rand(4)
    extras = {
        "step": 3,
        "cursor": 48,
        "scheduler": scheduler.state_dict(),
        "scaler": None,
        "world_size": 1,
        "rng": {"torch": rng, "cuda": None},
    }
    write_checkpoint_before_named_states(tmp_path, run_uri, 3, model, optimizer, extras, {"cursor": 48})

    other, other_opt = fresh(1)
    other_scheduler = build_scheduler(other_opt, warmup_steps=4, max_steps=20, min_lr_ratio=0.1)
    state = TrainState(torch.device("cpu"))
    ckpt = Checkpointer(
        open_storage(run_uri),
        run_uri,
        rank=0,
        world_size=1,
        keep=2,
        states=checkpoint_states(other, other_opt, other_scheduler, None, state),
    )
    assert ckpt.load_latest() == 3
    assert (state.step, state.cursor) == (3, 48)
    assert other_scheduler.last_epoch == scheduler.last_epoch == 3
    assert other_scheduler.get_last_lr() == scheduler.get_last_lr()
    assert torch.equal(torch.rand(4), next_draw)  # the RNG goes on where the saved one was
    for name, tensor in other.state_dict().items():
        assert torch.equal(tensor, model.state_dict()[name]), name
    for m, opt in ((model, optimizer), (other, other_opt)):  # the optimizer's moments came back too
        torch.manual_seed(3)
        train_one_step(m, opt)
    for name, tensor in other.state_dict().items():
        assert torch.equal(tensor, model.state_dict()[name]), name


def test_a_checkpoint_missing_a_state_is_refused_rather_than_resumed_in_part(world_of_one, tmp_path):
    """Weights without their schedule (or step, or cursor) would resume a lie: refused."""
    from trainer.checkpoint.save import CheckpointError
    from trainer.optim import build_scheduler
    from trainer.state import checkpoint_states

    run_uri = (tmp_path / "run").as_uri()
    model, optimizer = fresh(0)
    build_scheduler(optimizer, warmup_steps=4, max_steps=20, min_lr_ratio=0.1)  # as training had
    train_one_step(model, optimizer)
    train_state = {"step": 3, "cursor": 48, "rng": {"torch": torch.get_rng_state(), "cuda": None}}
    write_checkpoint_before_named_states(  # a per-rank file with named states, one of them missing
        tmp_path, run_uri, 3, model, optimizer, {"train_state": train_state}, {"cursor": 48}
    )
    other, other_opt = fresh(1)
    scheduler = build_scheduler(other_opt, warmup_steps=4, max_steps=20, min_lr_ratio=0.1)
    state = TrainState(torch.device("cpu"))
    ckpt = Checkpointer(
        open_storage(run_uri),
        run_uri,
        rank=0,
        world_size=1,
        keep=2,
        states=checkpoint_states(other, other_opt, scheduler, None, state),
    )
    with pytest.raises(CheckpointError, match=r"checkpoint step 3 holds no 'scheduler' state"):
        ckpt.load_latest()
    assert (state.step, state.cursor) == (0, 0)


def test_the_per_rank_file_holds_the_named_states_and_restores_the_rng(world_of_one, tmp_path):
    from trainer.optim import build_scheduler
    from trainer.state import checkpoint_states

    run_uri = (tmp_path / "run").as_uri()
    model, optimizer = fresh(0)
    scheduler = build_scheduler(optimizer, warmup_steps=4, max_steps=20, min_lr_ratio=0.1)
    state = TrainState(torch.device("cpu"), step=6, cursor=96)
    states = checkpoint_states(model, optimizer, scheduler, None, state)
    ckpt = Checkpointer(open_storage(run_uri), run_uri, rank=0, world_size=1, keep=2, states=states)
    torch.manual_seed(5)
    ckpt.save(6)
    after_save = torch.rand(3)
    saved = torch.load(tmp_path / "run/checkpoints/step_00000006/attempt_1/extra_rank0.pt", weights_only=True)
    assert set(saved) == {"scheduler", "train_state"}
    assert (saved["train_state"]["step"], saved["train_state"]["cursor"]) == (6, 96)

    torch.manual_seed(99)  # a fresh process would have another RNG state
    state.step = state.cursor = 0
    assert ckpt.load_latest() == 6
    assert (state.step, state.cursor) == (6, 96)
    assert torch.equal(torch.rand(3), after_save)


def test_a_checkpointer_needs_the_model_and_the_optimizer(world_of_one, tmp_path):
    run_uri = (tmp_path / "run").as_uri()
    with pytest.raises(ValueError, match=r"needs the states \['model', 'optim'\]; \['optim'\] missing"):
        Checkpointer(open_storage(run_uri), run_uri, 0, 1, keep=1, states={"model": ModelState(fresh(0)[0])})


def listing(storage, layout):
    return sorted(storage.list(layout.checkpoints))


def test_when_checkpoints_were_committed_but_none_loads_the_load_fails_naming_each(world_of_one, tmp_path):
    from trainer.checkpoint.save import NothingToResume

    run_uri = (tmp_path / "run").as_uri()
    storage, layout = open_storage(run_uri), RunLayout(run_uri)
    model, optimizer = fresh(0)
    ckpt, state = checkpointer(storage, run_uri, model, optimizer, keep=2)
    for step in (10, 20):
        train_one_step(model, optimizer)
        advance(state, step, step)
        ckpt.save(step)
    (tmp_path / "run/checkpoints/step_00000020/attempt_1/__0_0.distcp").write_bytes(b"short")
    shard = tmp_path / "run/checkpoints/step_00000010/attempt_1/__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF  # only the checksum sees it
    shard.write_bytes(bytes(data))
    before = listing(storage, layout)

    other, other_opt = fresh(1)
    loader, loaded = checkpointer(storage, run_uri, other, other_opt, keep=2)
    with pytest.raises(NothingToResume) as failed:
        loader.load_latest()
    message = str(failed.value)
    assert message.startswith(
        f"checkpoints were committed under {layout.checkpoints} but none can be resumed"
    )
    assert "step 20: file __0_0.distcp has 5 bytes, _COMMITTED says" in message
    assert re.search(
        r"step 10: checkpoint file \S+/step_00000010/attempt_1/__0_0.distcp has sha256 \w+", message
    )
    assert message.endswith(
        "refusing to start over from step 0: restore the damaged files, delete the _COMMITTED of each bad "
        "checkpoint to fall back to an older one (delete them all, and latest.json, to start from step 0), "
        "or start the run under a new run prefix"
    )
    assert failed.value.cause == "program"  # a relaunch would find the same
    assert (loaded.step, loaded.cursor) == (0, 0)  # nothing was restored...
    assert listing(storage, layout) == before  # ...and nothing written


def test_a_checkpoint_left_without_a_commit_is_no_reason_to_refuse_a_fresh_start(world_of_one, tmp_path):
    run_uri = (tmp_path / "run").as_uri()
    storage, layout = open_storage(run_uri), RunLayout(run_uri)
    storage.put(f"{layout.checkpoint_files(10, 1)}/__0_0.distcp", b"partial")  # the first save died
    model, optimizer = fresh(0)
    ckpt, _ = checkpointer(storage, run_uri, model, optimizer, keep=1)
    assert ckpt.load_latest() is None


def test_a_fenced_attempt_commits_nothing_in_the_foreground_or_the_background(world_of_one, tmp_path):
    from trainer.checkpoint.fence import Fenced, raise_fence

    run_uri = (tmp_path / "run").as_uri()
    storage, layout = open_storage(run_uri), RunLayout(run_uri)
    model, optimizer = fresh(0)
    old, state = checkpointer(storage, run_uri, model, optimizer, keep=2)
    advance(state, 10, 80)
    old.save(10)
    raise_fence(storage, layout, 2)  # attempt 2 started; this checkpointer is attempt 1's
    advance(state, 20, 160)
    with pytest.raises(Fenced, match=r"attempt 1 is fenced: attempt 2 started after it"):
        old.save(20)
    old.save_async(30)
    with pytest.raises(Fenced, match=r"attempt 1 is fenced.*checkpoint step 30 was not committed"):
        old.wait()
    assert [p.name for p in (tmp_path / "run/checkpoints").glob("step_*/_COMMITTED")] == ["_COMMITTED"]
    latest = json.loads((tmp_path / "run/checkpoints/latest.json").read_text())
    assert (latest["step"], latest["attempt"], old.last_committed) == (10, 1, 10)


def test_a_newer_attempt_recommitting_a_step_replaces_the_older_files_and_prunes_around_zombies(
    world_of_one, tmp_path
):
    from trainer.checkpoint.fence import raise_fence

    run_uri = (tmp_path / "run").as_uri()
    storage, layout = open_storage(run_uri), RunLayout(run_uri)
    model, optimizer = fresh(0)
    first, state = checkpointer(storage, run_uri, model, optimizer, keep=2)
    for step in (10, 20):
        advance(state, step, step)
        first.save(step)
    raise_fence(storage, layout, 2)  # after step 20
    states = {"model": ModelState(model), "optim": OptimizerState(model, optimizer), "train_state": state}
    second = Checkpointer(storage, run_uri, rank=0, world_size=1, keep=2, states=states, attempt=2)
    # a zombie (attempt 1) left a void marker at 25 and files at 30; an attempt 3 wrote into 15
    storage.put(f"{layout.checkpoint_files(25, 1)}/a", b"z")
    storage.put_json(
        layout.committed_marker(25), {"format": "trainops.checkpoint/v1", "step": 25, "attempt": 1}
    )
    storage.put(f"{layout.checkpoint_files(15, 3)}/a", b"new")
    advance(state, 20, 20)
    second.save(20)
    objects = [uri.rsplit("/checkpoints/", 1)[1] for uri in listing(storage, layout)]
    assert not [o for o in objects if o.startswith("step_00000020/attempt_1/")]  # replaced
    assert json.loads((tmp_path / "run/checkpoints/step_00000020/_COMMITTED").read_text())["attempt"] == 2
    steps = sorted({o.split("/")[0] for o in objects if o.startswith("step_")})
    assert steps == ["step_00000010", "step_00000015", "step_00000020", "step_00000025"]
    advance(state, 30, 30)
    second.save(30)
    left = sorted(
        {uri.rsplit("/checkpoints/", 1)[1].split("/")[0] for uri in listing(storage, layout)}
        - {"latest.json"}
    )
    # keep=2 counts only trusted commits (20 and 30, not the void 25); 15 holds a newer attempt's files
    assert left == ["step_00000015", "step_00000020", "step_00000030"]


SMALL_FILES = {"latest.json", "_COMMITTED"}  # the commit protocol's own JSON documents


def test_a_save_reads_back_none_of_what_it_wrote_and_its_checksums_hold(world_of_one, tmp_path, monkeypatch):
    from trainer.data import cache_dir

    run_uri = (tmp_path / "run").as_uri()
    layout, storage = RunLayout(run_uri), open_storage(run_uri)
    model, optimizer = fresh(0)
    ckpt, state = checkpointer(storage, run_uri, model, optimizer, keep=3)
    train_one_step(model, optimizer)
    reads = count_reads(monkeypatch, [tmp_path, cache_dir()])

    advance(state, 5, 40)
    ckpt.save(5)  # synchronous, as the emergency and final saves are
    train_one_step(model, optimizer)
    advance(state, 10, 80)
    ckpt.save_async(10)
    assert ckpt.wait() and ckpt.last_committed == 10
    assert {name: count for name, count in reads.items() if name not in SMALL_FILES} == {}
    picked, _ = find_latest(storage, layout)  # picking one to resume checks sizes by head()
    assert picked == 10
    if has_user_xattrs(tmp_path):  # else head() reads files to find their etags (docs/trainer.md)
        assert {name: count for name, count in reads.items() if name not in SMALL_FILES} == {}

    monkeypatch.undo()
    for step in (5, 10):
        marker = json.loads((tmp_path / f"run/checkpoints/step_{step:08d}/_COMMITTED").read_text())
        for entry in marker["files"]:
            data = (tmp_path / f"run/checkpoints/step_{step:08d}/attempt_1" / entry["name"]).read_bytes()
            assert (entry["size"], entry["sha256"]) == (len(data), hashlib.sha256(data).hexdigest())


def test_a_staged_file_the_save_did_not_write_or_that_changed_is_refused(tmp_path):
    written = Written()
    with hashing_open(tmp_path / "extra_rank0.pt", written) as f:
        f.write(b"state")
    assert written_entry(tmp_path / "extra_rank0.pt", written) == {
        "name": "extra_rank0.pt",
        "size": 5,
        "sha256": hashlib.sha256(b"state").hexdigest(),
    }
    (tmp_path / "stray.bin").write_bytes(b"?")
    with pytest.raises(
        CheckpointError, match=r"stray.bin was not written by this save, so it has no checksum"
    ):
        written_entry(tmp_path / "stray.bin", written)
    with open(tmp_path / "extra_rank0.pt", "ab") as f:
        f.write(b"!")
    with pytest.raises(CheckpointError, match=r"extra_rank0.pt has 6 bytes, but 5 were written"):
        written_entry(tmp_path / "extra_rank0.pt", written)


STORED = Path(__file__).resolve().parents[2] / "data" / "checkpoint_v1"


def test_a_checkpoint_written_by_an_earlier_version_still_resumes(world_of_one, tmp_path, monkeypatch):
    """tests/data/checkpoint_v1 holds a run folder an earlier trainer wrote (its README says which
    commit and how); today's checkpointer resumes it at its step and data cursor, with the weights
    torch itself reads from it."""
    import shutil

    from trainer.models.builder import build_model
    from trainer.optim import build_scheduler
    from trainer.state import checkpoint_states

    expected = json.loads((STORED / "expected.json").read_text())
    shutil.copytree(STORED / "run", tmp_path / "run")
    run_uri = (tmp_path / "run").as_uri()
    monkeypatch.syspath_prepend(str(STORED))  # its model: model.builder=tiny_llama:build
    marker = json.loads((tmp_path / "run" / "checkpoints" / "step_00000003" / "_COMMITTED").read_text())
    torch.manual_seed(123)  # other weights than the stored ones
    built = build_model("tiny", marker["model"]["builder"], vocab_size=257, seq_len=32)
    optimizer = build_optimizer(built.model, lr=3.0e-3, weight_decay=0.1)
    scheduler = build_scheduler(optimizer, warmup_steps=1, max_steps=3, min_lr_ratio=0.1)
    state = TrainState(torch.device("cpu"))
    ckpt = Checkpointer(
        open_storage(run_uri),
        run_uri,
        rank=0,
        world_size=1,
        keep=1,
        states=checkpoint_states(built.model, optimizer, scheduler, None, state),
    )
    assert ckpt.load_latest() == expected["step"] == 3
    assert (state.step, state.cursor) == (3, expected["cursor"]) == (3, 24)
    assert scheduler.last_epoch == 3
    got = {
        name: hashlib.sha256(t.detach().to(torch.float32).contiguous().numpy().tobytes()).hexdigest()
        for name, t in sorted(built.model.state_dict().items())
    }
    assert got == expected["weights"]
    assert all(s["step"].item() == 3 for s in optimizer.state.values())  # Adam's moments came back
