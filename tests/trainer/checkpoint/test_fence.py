"""Fencing: once a newer attempt started, an older gang's checkpoint commits are refused.

The decisions over plain records; the two writers on ``file://`` and on S3 (moto's server over
HTTP), with the fence going up at each point of a commit, and racing it for real in threads;
then the whole trainer under torchrun: a gang kept running as a zombie after the next attempt
started and resumed, whose late commit is refused.
"""

from __future__ import annotations

import json
import subprocess
import threading

import pytest

from tests.trainer.helpers import (
    GLOBAL_BATCH,
    INSTRUMENTED,
    ForwardingStorage,
    metrics_of,
    read_json,
    run_config,
    torchrun_argv,
    trainer_env,
)
from trainer.checkpoint import fence
from trainer.checkpoint.commit import commit_marker
from trainer.checkpoint.fence import Fenced, advanced, as_latest, raised, refusal, void_reason
from trainer.checkpoint.files import survey
from trainer.contract import RunLayout
from trainer.storage import Storage, open_storage


# --- the decisions -----------------------------------------------------------------------------
def test_an_attempt_older_than_the_newest_that_started_is_refused():
    entries = [{"attempt": 2, "after_step": 20}, {"attempt": 3, "after_step": 35}]
    assert refusal(entries, 3) is None and refusal(entries, 4) is None and refusal([], 1) is None
    assert refusal(entries, 2) == (
        "attempt 2 is fenced: attempt 3 started after it, so this gang is stale (its pods were "
        "probably force-removed) and its checkpoint commits are refused"
    )


@pytest.mark.parametrize(
    "writer, step, void",
    [
        (1, 20, False),  # committed before attempt 2 started
        (1, 21, True),  # came after attempt 2 started
        (2, 35, False),  # before attempt 3 started
        (2, 36, True),
        (3, 90, False),  # the newest: never void
        (0, 20, False),  # a marker written before markers named their attempt
        (0, 21, True),
    ],
)
def test_a_marker_written_after_a_newer_attempt_started_is_void(writer, step, void):
    entries = [{"attempt": 2, "after_step": 20}, {"attempt": 3, "after_step": 35}]
    assert (void_reason(entries, writer, step) is not None) == void


def test_the_void_reason_says_who_wrote_it_and_when_the_fence_went_up():
    assert void_reason([{"attempt": 2, "after_step": 20}], 1, 30) == (
        "committed by attempt 1 after attempt 2 had started (the fence allows attempt 1 no commit after step 20)"
    )


def test_latest_json_keeps_its_fence_through_commits_and_old_files_still_read():
    old = as_latest({"step": 15, "uri": "file:///r/checkpoints/step_00000015"})
    assert old == {"step": 15, "uri": "file:///r/checkpoints/step_00000015"}
    with_fence = raised(old, 2, 15)
    assert with_fence["fence"] == [{"attempt": 2, "after_step": 15}] and with_fence["step"] == 15
    moved = advanced(with_fence, 20, "file:///r/checkpoints/step_00000020", 2)
    assert moved == {
        "step": 20,
        "uri": "file:///r/checkpoints/step_00000020",
        "attempt": 2,
        "fence": [{"attempt": 2, "after_step": 15}],
    }
    assert raised(None, 1, 0) == {"step": 0, "uri": None, "fence": [{"attempt": 1, "after_step": 0}]}
    assert as_latest({"step": "x"}) is None and as_latest([1]) is None
    assert as_latest({"step": 1, "uri": None, "fence": [{"attempt": "2"}]}) is None


# --- the writers, on file:// and S3 --------------------------------------------------------------
@pytest.fixture(params=["file", "s3"])
def run_uri(request, tmp_path):
    root = (tmp_path / "root").as_uri() if request.param == "file" else request.getfixturevalue("s3_root")
    return f"{root}/runs/r1"


def marker_of(step: int, attempt: int) -> dict:
    return commit_marker(
        step=step, files=[{"name": "a", "size": 1, "sha256": "x"}], world_size=1, time=0.0, attempt=attempt
    )


def put_files(storage: Storage, layout: RunLayout, step: int, attempt: int) -> None:
    storage.put(f"{layout.checkpoint_files(step, attempt)}/a", b"1")


def commit_step(storage, layout, step, attempt):
    put_files(storage, layout, step, attempt)
    return fence.commit(storage, layout, step, marker_of(step, attempt), attempt)


def test_raising_the_fence_records_the_newest_commit_and_refuses_older_attempts(run_uri):
    storage, layout = open_storage(run_uri), RunLayout(run_uri)
    assert fence.raise_fence(storage, layout, 1) == {
        "step": 0,
        "uri": None,
        "fence": [{"attempt": 1, "after_step": 0}],
    }
    commit_step(storage, layout, 10, 1)
    assert fence.raise_fence(storage, layout, 1)["step"] == 10  # a retried start changes nothing
    latest = fence.raise_fence(storage, layout, 2)
    assert latest["fence"] == [{"attempt": 1, "after_step": 0}, {"attempt": 2, "after_step": 10}]
    assert storage.get_json(layout.latest) == latest

    with pytest.raises(
        Fenced, match=r"^attempt 1 is fenced: attempt 2 started after it.*step 20 was not committed"
    ):
        commit_step(storage, layout, 20, 1)
    assert not storage.exists(layout.committed_marker(20))
    assert storage.get_json(layout.latest)["step"] == 10
    with pytest.raises(Fenced, match="attempt 1 is fenced: attempt 2 started after it"):
        fence.raise_fence(storage, layout, 1)  # a gang that starts after its successor: stale at once

    written = commit_step(storage, layout, 20, 2)
    assert (written["step"], written["attempt"], written["fence"]) == (20, 2, latest["fence"])


def test_a_commit_never_replaces_a_newer_attempts_marker_but_replaces_an_older_one(run_uri):
    storage, layout = open_storage(run_uri), RunLayout(run_uri)
    commit_step(storage, layout, 10, 1)  # no fence at all: a run written before fencing
    commit_step(storage, layout, 10, 3)  # a newer attempt commits the same step again
    assert storage.get_json(layout.committed_marker(10))["attempt"] == 3
    with pytest.raises(Fenced, match="attempt 3 already committed step 10"):
        commit_step(storage, layout, 10, 2)
    assert storage.get_json(layout.committed_marker(10))["attempt"] == 3


class BeforeFirstPut(ForwardingStorage):
    """Runs ``rival`` (another process's writes) just before the first put to ``uri``: the moment
    a race would put them."""

    def __init__(self, inner: Storage, uri: str, rival):
        super().__init__(inner)
        self.uri, self.rival, self.done = uri, rival, False

    def before(self, action, uri):
        if action == "write" and uri == self.uri and not self.done:
            self.done = True
            self.rival()


def test_the_fence_going_up_before_a_zombies_marker_voids_it_and_refuses_latest_json(run_uri):
    storage, layout = open_storage(run_uri), RunLayout(run_uri)
    commit_step(storage, layout, 10, 1)
    put_files(storage, layout, 20, 1)
    # attempt 1 checked the fence and is about to write step 20's marker when attempt 2 starts
    racing = BeforeFirstPut(
        storage, layout.committed_marker(20), lambda: fence.raise_fence(storage, layout, 2)
    )
    with pytest.raises(Fenced, match=r"attempt 2 started after it.*latest\.json was not moved to step 20"):
        fence.commit(racing, layout, 20, marker_of(20, 1), 1)
    assert storage.get_json(layout.committed_marker(20))["attempt"] == 1  # it slipped in...
    latest = storage.get_json(layout.latest)
    assert (latest["step"], latest["attempt"]) == (10, 1)
    found = survey(storage, layout)  # ...and every reader ignores it
    assert found.picked is not None and found.picked[0] == 10
    assert found.refused == (
        (
            20,
            "committed by attempt 1 after attempt 2 had started (the fence allows attempt 1 no "
            "commit after step 10)",
        ),
    )


def test_a_marker_written_before_the_fence_went_up_stands_and_the_new_attempt_resumes_from_it(run_uri):
    storage, layout = open_storage(run_uri), RunLayout(run_uri)
    commit_step(storage, layout, 10, 1)
    put_files(storage, layout, 20, 1)
    # attempt 2 starts after attempt 1 wrote step 20's marker, before its latest.json write
    racing = BeforeFirstPut(storage, layout.latest, lambda: fence.raise_fence(storage, layout, 2))
    with pytest.raises(Fenced, match=r"latest\.json was not moved to step 20"):
        fence.commit(racing, layout, 20, marker_of(20, 1), 1)
    assert storage.get_json(layout.latest)["fence"][-1] == {"attempt": 2, "after_step": 20}
    found = survey(storage, layout)
    assert found.picked is not None and found.picked[0] == 20 and found.refused == ()


def test_a_zombie_racing_the_fence_for_real_never_commits_after_it(run_uri):
    """Threads: attempt 1 commits step after step while attempt 2 raises the fence at once. However
    they interleave, no commit of attempt 1 is trusted above the fence's step, latest.json is never
    moved by attempt 1 after it, and the pick a resume makes is at most that step."""
    for n in range(6):
        storage, layout = open_storage(run_uri), RunLayout(f"{run_uri}/round{n}")
        commit_step(storage, layout, 1, 1)
        go = threading.Event()
        zombie_steps: list[int] = []

        def zombie(storage=storage, layout=layout, steps=zombie_steps, go=go):
            go.wait()
            for step in range(2, 400):
                try:
                    commit_step(storage, layout, step, 1)
                except Fenced:
                    return
                steps.append(step)

        thread = threading.Thread(target=zombie)
        thread.start()
        go.set()
        while not zombie_steps:  # let it commit at least once, so the fence lands mid-stream
            assert thread.is_alive(), "the zombie thread died before its first commit"
            thread.join(0.001)
        after = fence.raise_fence(storage, layout, 2)["fence"][-1]["after_step"]
        thread.join(60)
        assert not thread.is_alive()
        assert zombie_steps and after >= zombie_steps[0]
        assert max(zombie_steps) <= after  # every commit it completed came before the fence
        latest = storage.get_json(layout.latest)
        assert latest["step"] <= after
        found = survey(storage, layout)
        assert found.picked is not None and found.picked[0] <= after
        for step, why in found.refused:  # its files without a marker, or a marker that slipped in
            assert step > after
            assert why.startswith(
                ("committed by attempt 1 after attempt 2 had started", "no _COMMITTED marker")
            )


# --- the whole trainer: a zombie gang under torchrun --------------------------------------------
def cursor_before(step: int) -> int:
    return (step - 1) * GLOBAL_BATCH


def wait_for(condition, procs, what: str, timeout: float = 120.0) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not condition():
        for proc, log in procs:
            assert proc.poll() is None, (
                f"{what}: a trainer exited early ({proc.returncode}):\n{log.read_text()[-3000:]}"
            )
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.mark.slow
def test_a_zombie_gangs_late_commit_is_refused_and_the_resumed_run_ends_identical(
    tmp_path, dataset_uri, reference_run
):
    """Attempt 1 is held still after its step-20 commit, as a partitioned node would be; attempt 2
    starts, raises the fence and resumes from step 20, and is held at step 26. Attempt 1 then goes
    on as a zombie: its step-30 commit is refused, it says so and exits at its next save without
    writing anything more. Attempt 2 finishes identical to an uninterrupted run."""
    config, _ = run_config(tmp_path, dataset_uri, "run")
    run, holds = tmp_path / "run", tmp_path / "holds"
    holds.mkdir()
    procs = []
    for attempt, held_at in ((1, cursor_before(23)), (2, cursor_before(26))):
        log = tmp_path / f"attempt{attempt}.log"
        with open(log, "w") as out:
            proc = subprocess.Popen(
                torchrun_argv(config, module=INSTRUMENTED),
                env=trainer_env(tmp_path / f"cache{attempt}", attempt, pause_at=f"{held_at}:{holds}"),
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        procs.append((proc, log))
        try:
            wait_for(
                lambda a=attempt: all((holds / f"paused_a{a}_r{r}").exists() for r in (0, 1)),
                procs,
                f"attempt {attempt} to be held",
            )
            if attempt == 1:  # its step-20 save runs in the background: let it commit first
                wait_for(
                    lambda: read_json(run / "checkpoints" / "latest.json")["step"] == 20, procs, "step 20"
                )
        except BaseException:
            for p, _ in procs:
                p.kill()
            raise
    zombie, resumed = procs
    try:
        (holds / "go_a1").touch()
        zombie[0].wait(timeout=120)
        zombie_log = zombie[1].read_text()
        assert zombie[0].returncode != 0
        assert (
            "checkpoint: step 30 not committed: attempt 1 is fenced: attempt 2 started after it" in zombie_log
        )
        assert "trainer: fenced: attempt 1 is fenced" in zombie_log
        assert not (run / "attempts" / "1.json").exists()  # it wrote no record: the operator moved on
        assert not (run / "checkpoints" / "step_00000030" / "_COMMITTED").exists()
        (holds / "go_a2").touch()
        assert resumed[0].wait(timeout=120) == 0, resumed[1].read_text()[-3000:]
    finally:
        for proc, _ in procs:
            proc.kill()

    assert "resume: step 20" in resumed[1].read_text()
    second = read_json(run / "attempts" / "2.json")
    assert (second["outcome"], second["resumed_from_step"], second["last_step"]) == ("completed", 20, 40)
    for step in (30, 40):
        marker = read_json(run / "checkpoints" / f"step_{step:08d}" / "_COMMITTED")
        assert (marker["attempt"], marker["dir"]) == (2, "attempt_2")
        assert sorted(p.name for p in (run / "checkpoints" / f"step_{step:08d}").iterdir()) == [
            "_COMMITTED",
            "attempt_2",
        ]  # the zombie's refused files are gone with the commit that replaced them
    latest = json.loads((run / "checkpoints" / "latest.json").read_text())
    assert (latest["step"], latest["attempt"]) == (40, 2)
    assert latest["fence"] == [{"attempt": 1, "after_step": 0}, {"attempt": 2, "after_step": 20}]
    assert (run / "export" / "model.safetensors").read_bytes() == (
        reference_run["run_dir"] / "export" / "model.safetensors"
    ).read_bytes()
    metrics = metrics_of(run)
    assert sorted(metrics) == list(range(1, 41))
    assert {metrics[s]["attempt"] for s in range(21, 41)} == {2}  # the zombie's records never win
