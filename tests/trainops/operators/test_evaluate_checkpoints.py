"""EvaluateCheckpointsOperator on a control-plane-like fake cluster and real file:// storage.

The test plays the training (job.json, config.yaml, committed checkpoints) and each evaluation
job (its score, its export), as ``python -m trainer train`` and ``trainer evaluate`` write them.
"""

from __future__ import annotations

from datetime import UTC, datetime
from types import SimpleNamespace

import pytest
from airflow.sdk.bases.sensor import PokeReturnValue
from airflow.sdk.exceptions import AirflowFailException, AirflowRescheduleException

from tests.trainops.cluster.fake_backend import LOG_TAIL, FakeCluster
from trainer.config import config_from_mapping, dump_yaml
from trainer.contract import MANIFEST_FORMAT, RunLayout, run_prefix
from trainer.presets import PRESETS, param_count
from trainer.storage import open_storage
from trainops.cluster.base import JobAlreadyExists
from trainops.gate.errors import GateConfigError
from trainops.operators import EvaluateCheckpointsOperator
from trainops.operators.eval_sizing import eval_pod
from trainops.recovery.record import RunFolderTaken, start_record

OWNER = {"dag_id": "retrain", "run_id": "manual__1", "task_id": "train", "map_index": -1}


class NamedJobs(FakeCluster):
    """Jobs by name, as a control plane keeps them: a second launch of a name is refused with
    the first one's handle; ``phase`` is what ``status`` says of each."""

    def __init__(self) -> None:
        super().__init__()
        self.jobs: dict[str, dict] = {}
        self.phase: dict[str, str] = {}

    def launch(self, spec, *, chaos=None):
        if spec.name in self.jobs and spec.name not in self.deleted:
            raise JobAlreadyExists(f"{spec.name} exists", self.jobs[spec.name])
        handle = super().launch(spec, chaos=chaos)
        handle["job_id"] = spec.name
        self.jobs[spec.name] = handle
        self.deleted = [d for d in self.deleted if d != spec.name]
        return handle

    def status(self, handle):
        return {
            "phase": self.phase.get(handle["job_id"], "running"),
            "reason": None,
            "nodes": [],
            "disruptions": [],
        }

    def step_of(self, name: str) -> int:
        return int(self.jobs[name]["labels"]["trainops/checkpoint-step"])


@pytest.fixture
def cluster(monkeypatch):
    fake = NamedJobs()
    monkeypatch.setattr("trainops.cluster.get_cluster", lambda name, **options: fake)
    return fake


class Run:
    """A training run in storage, written as the training task and the trainer write it."""

    def __init__(self, root: str, every_checkpoints: int = 1, keep: int = 1):
        self.root, self.store = root, open_storage(root)
        self.layout = RunLayout(run_prefix(root, "retrain", "manual__1", "train"))
        self.config = {
            "run_uri": self.layout.run_uri,
            "data_uri": f"{root}/datasets/d/v1",
            "checkpoint": {"every_steps": 30, "keep": keep},
            "eval": {"every_checkpoints": every_checkpoints},
        }

    def start(self, owner=OWNER):
        self.store.put(self.layout.config, dump_yaml(config_from_mapping(self.config)).encode())
        job = start_record(
            run_uri=self.layout.run_uri,
            config_uri=self.layout.config,
            cluster="local",
            capacity="spot",
            owner=owner,
        )
        self.store.put_json(self.layout.job, job)

    def commit(self, step):
        self.store.put_json(self.layout.committed_marker(step), {"step": step})
        self.store.put_json(self.layout.latest, {"step": step, "uri": self.layout.checkpoint(step)})

    def finish(self, status="succeeded"):
        job = self.store.get_json(self.layout.job)
        self.store.put_json(self.layout.job, {**job, "status": status})

    def scored(self, step, loss):
        """What the evaluation job of ``step`` writes: the export, then the score."""
        export = self.layout.checkpoint_export(step)
        self.store.put_json(f"{export}/export.json", {"step": step})
        candidate = {"model_uri": export, "eval_loss": loss}
        self.store.put_json(self.layout.checkpoint_score(step), {"candidate": candidate, "baseline": None})

    def training_result(self):
        return {
            "run_uri": self.layout.run_uri,
            "config_uri": self.layout.config,
            "export_uri": self.layout.export,
        }


@pytest.fixture
def run(file_root):
    return Run(file_root)


def context(training=None, train_state="running", try_number=1):
    ti = SimpleNamespace(
        dag_id="retrain",
        run_id="manual__1",
        task_id="evaluate_checkpoints",
        map_index=-1,
        try_number=try_number,
        xcom_pull=lambda task_ids, key: training,
        get_first_reschedule_date=lambda context: None,
        get_task_states=lambda dag_id, task_ids, run_ids: {run_ids[0]: {task_ids[0]: train_state}},
    )
    return {"ti": ti}


def operator(root, **kw):
    return EvaluateCheckpointsOperator(task_id="evaluate_checkpoints", storage_root=root, **kw)


def test_before_training_starts_it_gives_its_slot_back_and_looks_again(file_root, cluster):
    with pytest.raises(AirflowRescheduleException) as later:
        operator(file_root, poll_interval=10).execute(context())
    assert later.value.reschedule_date > datetime.now(UTC)
    assert cluster.launched == []


def test_one_job_per_due_checkpoint_each_launched_once_and_the_best_one_picked(run, cluster, capfd):
    run.start()
    op = operator(run.root)
    run.commit(30)
    assert op.poke(context()) is False  # step 30's job launched; the slot goes back
    assert op.poke(context()) is False  # still running: the same job, never a second
    ((spec, _),) = cluster.launched
    assert spec.args[spec.args.index("evaluate") :] == [
        "evaluate",
        "--config",
        run.layout.config,
        f"eval.model_uri={run.layout.checkpoint(30)}",
        f"eval.export_uri={run.layout.checkpoint_export(30)}",
        f"eval.output_uri={run.layout.checkpoint_score(30)}",
        "eval.baseline_uri=",
    ]
    assert (spec.nodes, spec.gpus_per_node, spec.capacity) == (1, 0, "on-demand")
    run.scored(30, 2.5)
    cluster.phase[spec.name] = "succeeded"
    run.commit(50)  # an emergency save: never scored
    run.commit(60)
    assert op.poke(context()) is False  # 30 read (its job deleted), 60 launched
    assert cluster.deleted == [spec.name]
    assert [cluster.step_of(s.name) for s, _ in cluster.launched] == [30, 60]
    run.scored(60, 2.1)
    cluster.phase[cluster.launched[1][0].name] = "succeeded"
    run.commit(90)
    run.finish()
    assert op.poke(context()) is False  # 90, the last, launched
    run.scored(90, 2.3)
    cluster.phase[cluster.launched[2][0].name] = "succeeded"

    # Training's own result is not published yet: look again, the pick already written.
    assert op.poke(context(training=None)) is False
    result = op.poke(context(training=run.training_result()))
    assert isinstance(result, PokeReturnValue) and result.is_done
    picked = result.xcom_value
    assert picked["export_uri"] == run.layout.checkpoint_export(60)  # the best, not the last
    assert picked["checkpoint_pick"]["step"] == 60 and picked["run_uri"] == run.layout.run_uri
    assert run.store.get_json(run.layout.checkpoint_pick)["why"].startswith(
        "step 60 has the best eval_loss (2.1"
    )
    # Only the pick's export stays; the checkpoints kept only for their scores go (keep=1:
    # the trainer keeps 90, its newest), the emergency save is the trainer's to prune.
    assert [s for s in (30, 60, 90) if run.store.head(f"{run.layout.checkpoint_export(s)}/export.json")] == [
        60
    ]
    assert [s for s in (30, 50, 60, 90) if run.store.head(run.layout.committed_marker(s))] == [50, 90]
    assert "checkpoint step 60: eval_loss 2.1" in capfd.readouterr().out


def test_each_job_is_sized_for_the_checkpoint_it_loads(file_root, cluster):
    run = Run(file_root)
    run.config["model"] = {"preset": "1b"}
    manifest = {"format": MANIFEST_FORMAT, "tokenizer": {"vocab_size": 32000}, "splits": {}}
    run.store.put_json(f"{run.config['data_uri']}/manifest.json", manifest)
    run.start()
    run.commit(30)
    operator(file_root, job_options={"cpu": "4"}).poke(context())
    ((spec, _),) = cluster.launched
    pod = eval_pod(param_count(PRESETS["1b"].with_vocab(32000)), gpus=0, checkpoint=True).options()
    assert (spec.memory, spec.cache_size, spec.ephemeral_storage) == (
        pod["memory"],
        pod["cache_size"],
        pod["ephemeral_storage"],
    )
    assert spec.cpu == "4"  # job_options win


def test_a_failed_evaluation_fails_with_its_log_and_a_retry_launches_it_afresh(run, cluster):
    run.start()
    run.commit(30)
    op = operator(run.root)
    op.poke(context())
    name = cluster.launched[0][0].name
    cluster.phase[name] = "failed"
    with pytest.raises(
        RuntimeError, match=rf"checkpoint step 30 \(job {name}\) did not succeed \(failed\)"
    ) as failed:
        op.poke(context())
    assert LOG_TAIL in str(failed.value) and cluster.deleted == [name]
    del cluster.phase[name]
    op.poke(context())  # the retry
    assert len(cluster.launched) == 2 and cluster.deleted == []


def test_a_checkpoint_pruned_while_its_job_ran_is_skipped_and_the_others_still_picked(
    run, cluster, monkeypatch
):
    run.start()
    run.commit(30)
    op = operator(run.root)
    op.poke(context())
    name = cluster.launched[0][0].name

    def pruned_meanwhile(handle):  # the checkpoint goes while the job reads it: the job fails
        run.store.delete_prefix(run.layout.checkpoint(30))
        return {"phase": "failed", "reason": None, "nodes": [], "disruptions": []}

    monkeypatch.setattr(cluster, "status", pruned_meanwhile)
    run.commit(60)
    op.poke(context())
    assert run.store.get_json(run.layout.checkpoint_score(30))["skipped"] == (
        f"its checkpoint was deleted before it could be scored (job {name})"
    )
    monkeypatch.undo()
    monkeypatch.setattr("trainops.cluster.get_cluster", lambda name, **options: cluster)
    run.scored(60, 2.0)
    cluster.phase[cluster.launched[1][0].name] = "succeeded"
    run.finish()
    picked = op.poke(context(training=run.training_result())).xcom_value["checkpoint_pick"]
    assert picked["step"] == 60
    assert picked["checkpoints"][0] == {
        "step": 30,
        "value": None,
        "skipped": picked["checkpoints"][0]["skipped"],
    }


def test_a_lost_launch_note_reattaches_to_the_job_never_a_second(run, cluster, monkeypatch):
    run.start()
    run.commit(30)
    op = operator(run.root)
    op.poke(context())
    run.store.delete(f"{run.layout.checkpoint_scores}/in_flight.json")  # the note's write was lost
    op.poke(context())
    assert len(cluster.launched) == 1  # the second launch was refused with the first's handle
    assert run.store.get_json(f"{run.layout.checkpoint_scores}/in_flight.json")["step"] == 30


def test_a_storage_outage_only_makes_it_look_again_later(
    faulty_s3_root, s3_faults, cluster, monkeypatch, capfd
):
    monkeypatch.setenv("AIRFLOW__TRAINOPS__STORAGE_OUTAGE_TOLERANCE", "1")
    run = Run(faulty_s3_root)
    run.start()
    run.commit(30)
    op = operator(run.root)
    s3_faults.blackout(mode="reset")  # every connection reset, for longer than the tolerance
    try:
        assert op.poke(context()) is False
    finally:
        s3_faults.end_blackout()
    assert "storage is unavailable" in capfd.readouterr().out and cluster.launched == []
    assert op.poke(context()) is False  # storage is back: step 30's job is launched
    assert [cluster.step_of(s.name) for s, _ in cluster.launched] == [30]


def test_a_run_folder_of_another_dag_run_is_refused(run, cluster):
    run.start(owner={**OWNER, "run_id": "manual__2"})
    with pytest.raises(RunFolderTaken, match="belongs to dag 'retrain', run 'manual__2'"):
        operator(run.root).poke(context())
    assert cluster.launched == []


def test_a_run_without_mid_run_evaluation_says_which_key_to_set(file_root, cluster):
    run = Run(file_root, every_checkpoints=0)
    run.start()
    with pytest.raises(
        AirflowFailException, match=r"eval.every_checkpoints 0: set it in the trainer_config of 'train'"
    ):
        operator(file_root).poke(context())


def test_a_run_that_starts_over_on_a_retry_is_refused(file_root, cluster):
    run = Run(file_root)
    run.config["resume"] = "never"
    run.start()
    with pytest.raises(AirflowFailException, match=r"resume 'never': mid-run evaluation needs resume 'auto'"):
        operator(file_root).poke(context())


def test_failed_training_fails_the_task_once_the_training_task_gave_up(run, cluster):
    run.start()
    run.finish("failed")
    assert operator(run.root).poke(context(train_state="up_for_retry")) is False  # its retry resumes
    with pytest.raises(AirflowFailException, match=r"training failed \(its task is failed\)"):
        operator(run.root).poke(context(train_state="failed"))


def test_a_look_that_died_after_deleting_a_finished_job_reads_its_score(run, cluster):
    run.start()
    run.commit(30)
    op = operator(run.root)
    op.poke(context())
    name = cluster.launched[0][0].name
    run.scored(30, 2.5)
    cluster.phase[name] = "lost"  # deleted by the look that died before it deleted its note
    assert op.poke(context()) is False
    assert len(cluster.launched) == 1 and cluster.deleted == [name]  # read, never relaunched


def test_a_retry_of_the_task_launches_a_job_of_its_own(run, cluster):
    run.start()
    run.commit(30)
    operator(run.root).poke(context(try_number=2))
    assert cluster.launched[0][0].name.endswith("-a2")


def test_bad_settings_are_refused_when_the_dag_is_parsed():
    with pytest.raises(GateConfigError, match=r"best_by has unknown metric 'recall'.*needs 'direction'"):
        EvaluateCheckpointsOperator(task_id="c", best_by="recall")
    with pytest.raises(GateConfigError, match=r"best_by says accuracy is lower_is_better"):
        EvaluateCheckpointsOperator(task_id="c", best_by="accuracy", direction="lower_is_better")
    assert (
        EvaluateCheckpointsOperator(task_id="c", best_by="recall", direction="higher_is_better").mode
        == "reschedule"
    )
    with pytest.raises(
        ValueError, match=r"mode: this operator always waits in reschedule mode.*set poll_interval"
    ):
        EvaluateCheckpointsOperator(task_id="c", mode="poke")
    with pytest.raises(ValueError, match="capacity 'spot-then-on-demand'"):
        EvaluateCheckpointsOperator(task_id="c", capacity="spot-then-on-demand")
