"""EvaluateModelOperator: one evaluation job for the candidate and production, on the fake cluster.

The test plays the job: it writes ``eval/metrics.json`` as ``python -m trainer evaluate`` does.
"""

from pathlib import Path
from types import SimpleNamespace

import pytest
from airflow.sdk.exceptions import AirflowFailException, TaskDeferred

from tests.trainops.cluster.fake_backend import LOG_TAIL, use_fake_cluster
from trainer.contract import RunLayout, model_version_prefix, production_pointer, run_prefix
from trainer.storage import open_storage
from trainops.operators import EvaluateModelOperator
from trainops.registry.promotion import new_pointer

MODEL = "retrain-lm"
CANDIDATE = {"eval_loss": 2.1, "perplexity": 8.17, "tokens": 4096, "slices": {}}
PRODUCTION = {"eval_loss": 2.3, "perplexity": 9.97, "tokens": 4096, "slices": {}}


@pytest.fixture
def cluster(monkeypatch):
    return use_fake_cluster(monkeypatch)


@pytest.fixture
def context():
    return {"ti": SimpleNamespace(dag_id="retrain", run_id="manual__1", task_id="evaluate", map_index=-1)}


def training(root):
    run_uri = run_prefix(root, "retrain", "manual__1", "train")
    layout = RunLayout(run_uri)
    return {"run_uri": run_uri, "config_uri": layout.config, "export_uri": layout.export}


def operator(root, **kw):
    return EvaluateModelOperator(
        task_id="evaluate", training=training(root), model_name=MODEL, storage_root=root, **kw
    )


def promote_by_hand(root, version):
    """The production pointer as promotion leaves it, at ``version``."""
    uri = model_version_prefix(root, MODEL, version)
    pointer = new_pointer(
        None, name=MODEL, version=version, version_uri=uri, entry={"at": "t", "action": "promote"}
    )
    open_storage(root).put_json(production_pointer(root, MODEL), pointer)
    return uri


def job_ran(root, baseline=None):
    """What the evaluation job writes when it succeeds."""
    layout = RunLayout(training(root)["run_uri"])
    records = layout.eval_metrics.replace(".json", ".records.json")
    report = {"candidate": CANDIDATE, "baseline": baseline, "records_uri": records}
    open_storage(root).put_json(layout.eval_metrics, report)


def finished(handle, phase="succeeded", reason=None):
    state = {"phase": phase, "reason": reason, "nodes": [], "disruptions": []}
    return {"status": "finished", "handle": handle, "state": state}


def test_the_first_evaluation_launches_one_job_for_the_candidate_and_defers(file_root, cluster, context):
    with pytest.raises(TaskDeferred) as deferred:
        operator(file_root, job_timeout=600).execute(context)
    ((spec, _),) = cluster.launched
    train = training(file_root)
    assert spec.args == [
        "python",
        "-m",
        "trainer",
        "evaluate",
        "--config",
        train["config_uri"],
        f"eval.model_uri={train['export_uri']}",
        f"eval.output_uri={RunLayout(train['run_uri']).eval_metrics}",
    ]
    assert (spec.nodes, spec.distributed, spec.capacity) == (1, False, "on-demand")
    assert spec.name.startswith("eval-") and spec.labels["trainops/task"] == "evaluate"
    trigger = deferred.value.trigger.serialize()[1]
    assert (trigger["handle"]["job_id"], trigger["timeout"]) == (spec.name + "-x", 600)

    job_ran(file_root)
    result = operator(file_root).execute_complete(context, finished(trigger["handle"]))
    assert result == {
        "metrics_uri": RunLayout(train["run_uri"]).eval_metrics,
        "records_uri": RunLayout(train["run_uri"]).eval_metrics.replace(".json", ".records.json"),
        "run_uri": train["run_uri"],
        "model_name": MODEL,
        "candidate": CANDIDATE,
        "production": None,
        "production_version": None,
    }
    assert cluster.deleted == [trigger["handle"]["job_id"]]  # its metrics read: the job is cleaned up


def test_a_failed_watch_leaves_the_evaluation_running_and_says_how_to_go_on(file_root, cluster, context):
    with pytest.raises(TaskDeferred) as deferred:
        operator(file_root).execute(context)
    handle = deferred.value.trigger.handle
    error = {"status": "error", "handle": handle, "message": "status read failed for 601 s"}
    with pytest.raises(RuntimeError, match=r"could not watch evaluation job: status read failed for 601 s"):
        operator(file_root).execute_complete(context, error)
    assert cluster.deleted == []  # a failed read says nothing about the job


def test_production_is_evaluated_by_the_same_job_on_the_candidates_split(file_root, cluster, context):
    production_uri = promote_by_hand(file_root, 3)
    with pytest.raises(TaskDeferred) as deferred:
        operator(file_root).execute(context)
    ((spec, _),) = cluster.launched
    # One command, the candidate's config (its data and eval split), both models.
    assert spec.args[spec.args.index("--config") + 1] == training(file_root)["config_uri"]
    assert f"eval.baseline_uri={production_uri}" in spec.args
    assert f"eval.model_uri={training(file_root)['export_uri']}" in spec.args

    promote_by_hand(file_root, 4)  # another run promotes while this evaluation runs
    job_ran(file_root, baseline=PRODUCTION)
    resumed = operator(file_root)  # after the deferral: a fresh operator, nothing in memory
    result = resumed.execute_complete(context, finished(deferred.value.trigger.handle))
    # The version that was evaluated, read back from eval/request.json, not the pointer now.
    assert (result["production"], result["production_version"]) == (PRODUCTION, 3)
    request = open_storage(file_root).get_json(f"{training(file_root)['run_uri']}/eval/request.json")
    assert request == {
        "candidate_uri": training(file_root)["export_uri"],
        "production_uri": production_uri,
        "production_version": 3,
    }


def test_not_deferrable_waits_in_the_worker(file_root, cluster, context):
    cluster.states[1] = {"phase": "succeeded", "reason": None, "nodes": [], "disruptions": []}
    job_ran(file_root)
    result = operator(file_root, deferrable=False, poll_interval=0.01).execute(context)
    assert result["candidate"] == CANDIDATE and len(cluster.launched) == 1


def test_a_failed_evaluation_fails_with_the_jobs_reason_and_last_lines(file_root, cluster, context):
    with pytest.raises(TaskDeferred) as deferred:
        operator(file_root).execute(context)
    handle = deferred.value.trigger.handle
    with pytest.raises(RuntimeError) as failure:
        operator(file_root).execute_complete(context, finished(handle, "failed", "OOMKilled"))
    message = str(failure.value)
    assert f"evaluation job {handle['job_id']} did not succeed (OOMKilled)" in message
    assert LOG_TAIL in message
    # its last lines are in the message (and the task log): then the finished job is deleted
    assert cluster.deleted == [handle["job_id"]]


def test_a_timed_out_evaluation_is_deleted(file_root, cluster, context):
    with pytest.raises(TaskDeferred) as deferred:
        operator(file_root).execute(context)
    handle = deferred.value.trigger.handle
    timeout = {"status": "timeout", "handle": handle, "message": "job still running after 600s"}
    with pytest.raises(RuntimeError, match=r"did not succeed \(job still running after 600s\)"):
        operator(file_root).execute_complete(context, timeout)
    assert cluster.deleted == [handle["job_id"]]


def test_training_that_is_not_a_training_result_is_refused_before_anything_runs(file_root, cluster, context):
    op = EvaluateModelOperator(task_id="evaluate", training={"run_uri": "x"}, model_name=MODEL)
    with pytest.raises(ValueError, match="training must be an FSDPTrainingOperator result with 'config_uri'"):
        op.execute(context)
    assert cluster.launched == []


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"capacity": "spot-then-on-demand"}, "an evaluation runs on 'spot' or 'on-demand'"),
        ({"cluster": "slurm"}, "cluster must be one of"),
        ({"job_options": {"nodes": 2}}, "must not set 'nodes'"),
        (
            {"cluster": "kubernetes", "job_options": {"env": {"AWS_SECRET_ACCESS_KEY": "abc"}}},
            "AWS_SECRET_ACCESS_KEY",
        ),
        (
            {"gpus_per_node": "1"},
            "gpus_per_node must be an integer >= 0, got the text '1'; write 1 without quotes",
        ),
        ({"gpus_per_node": -1}, "gpus_per_node must be an integer >= 0, got -1"),
        ({"poll_interval": -1}, "poll_interval must be a positive number of seconds, got -1"),
        ({"job_timeout": 0}, "job_timeout must be a positive number of seconds, got 0"),
        (
            {"job_options": {"cpu": "-2"}},
            r"JobSpec cpu '-2' is not a positive Kubernetes quantity \(negative\)",
        ),
    ],
)
def test_bad_parameters_are_refused_when_the_dag_is_parsed(kwargs, message):
    with pytest.raises(ValueError, match=message):
        EvaluateModelOperator(task_id="evaluate", training={}, model_name=MODEL, **kwargs)


def test_a_gpu_the_local_host_lacks_is_refused_before_anything_is_written(file_root, cluster, context):
    """``CUDA_VISIBLE_DEVICES=""`` in the job's environment hides every GPU, on any host."""
    op = operator(file_root, gpus_per_node=1, job_options={"env": {"CUDA_VISIBLE_DEVICES": ""}})
    with pytest.raises(
        ValueError,
        match=r"gpus_per_node=1 on 1 local node\(s\) needs 1 GPU\(s\) on this host, but it has none \(.*\); set gpus_per_node=0",
    ):
        op.execute(context)
    assert cluster.launched == []
    assert open_storage(file_root).list(file_root) == []  # no eval/request.json either


def test_a_model_name_that_is_not_one_is_refused_at_parse_or_once_rendered_before_launch(
    file_root, cluster, context
):
    with pytest.raises(
        ValueError, match=r"model_name 'xxxx.*is 300 characters long; at most 128 are allowed"
    ):
        EvaluateModelOperator(task_id="evaluate", training={}, model_name="x" * 300)
    op = EvaluateModelOperator(
        task_id="evaluate",
        training=training(file_root),
        model_name="{{ params.model }}",
        storage_root=file_root,
    )
    op.model_name = "retrain-lm\n"  # as rendered from a param with a trailing newline
    with pytest.raises(  # a retry cannot change it: failed at once
        AirflowFailException,
        match=r"model_name 'retrain-lm\\n' holds the invisible or control character U\+000A",
    ):
        op.execute(context)
    assert cluster.launched == []


def test_a_production_pointer_of_another_model_fails_the_evaluation_before_launch(
    file_root, cluster, context
):
    """The folder computed for ``retrain_lm`` holds ``retrain lm``'s pointer (trainops before #25):
    evaluating against it would compare the candidate with another model's production."""
    storage = open_storage(file_root)
    pointer = new_pointer(
        None, name="retrain lm", version=3, version_uri="file:///v3", entry={"at": "t", "action": "promote"}
    )
    storage.put_json(production_pointer(file_root, "retrain_lm"), pointer)
    op = EvaluateModelOperator(
        task_id="evaluate", training=training(file_root), model_name="retrain_lm", storage_root=file_root
    )
    with pytest.raises(AirflowFailException, match=r"records model 'retrain lm', not 'retrain_lm'"):
        op.execute(context)
    assert cluster.launched == []


def test_a_teams_own_scorers_go_to_the_job_and_a_malformed_one_is_refused_at_parse(
    file_root, cluster, context
):
    with pytest.raises(TaskDeferred):
        where = {"env": {"PYTHONPATH": str(Path(__file__).resolve().parents[3] / "examples")}}
        operator(file_root, metrics=["team_metrics:worst_label_recall"], job_options=where).execute(context)
    ((spec, _),) = cluster.launched
    assert spec.args[-1] == "eval.metrics=['team_metrics:worst_label_recall']"
    from trainer.config import parse_override

    assert parse_override(spec.args[-1]) == {"eval": {"metrics": ["team_metrics:worst_label_recall"]}}
    with pytest.raises(ValueError, match=r"^metrics: eval.metrics: expected 'module:function', got 'recall'"):
        operator(file_root, metrics=["recall"])
    with pytest.raises(ValueError, match=r"^metrics must be a list of 'module:function' strings"):
        operator(file_root, metrics="team_metrics:score")


def test_a_scorer_the_local_cluster_cannot_find_is_refused_before_launch(file_root, cluster, context):
    with pytest.raises(
        Exception, match=r"eval.metrics 'no_team_here:score': no module 'no_team_here' on the local"
    ):
        operator(file_root, metrics=["no_team_here:score"]).execute(context)
    examples = str(Path(__file__).resolve().parents[3] / "examples")
    with pytest.raises(
        Exception,
        match=r"eval.metrics 'team_metrics:recall': module 'team_metrics' \(.*\) has no function 'recall'",
    ):
        operator(
            file_root, metrics=["team_metrics:recall"], job_options={"env": {"PYTHONPATH": examples}}
        ).execute(context)
    assert cluster.launched == []


def test_the_evaluation_pod_is_sized_for_the_model_it_loads(file_root, cluster, context):
    from trainer.config import config_from_mapping, dump_yaml
    from trainer.contract import MANIFEST_FORMAT
    from trainer.presets import PRESETS, param_count
    from trainops.operators.eval_sizing import eval_pod

    train, store = training(file_root), open_storage(file_root)
    data_uri = f"{file_root}/datasets/d/v1"
    config = config_from_mapping(
        {"run_uri": train["run_uri"], "data_uri": data_uri, "model": {"preset": "7b"}}
    )
    store.put(train["config_uri"], dump_yaml(config).encode())
    manifest = {"format": MANIFEST_FORMAT, "tokenizer": {"vocab_size": 32000}, "splits": {}}
    store.put_json(f"{data_uri}/manifest.json", manifest)
    with pytest.raises(TaskDeferred):
        operator(file_root).execute(context)
    ((spec, _),) = cluster.launched
    params = param_count(PRESETS["7b"].with_vocab(32000))
    assert spec.memory == eval_pod(params, gpus=0, checkpoint=False).options()["memory"]
    assert int(spec.memory.removesuffix("Gi")) * 2**30 >= params * 6  # the fp32 model and the weights read
