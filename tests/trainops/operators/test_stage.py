import json
import re
import uuid
from types import SimpleNamespace

import pytest
from airflow.sdk import Asset, AssetAlias
from airflow.sdk.exceptions import AirflowFailException

import trainops.cluster
from tests.bundles import use_dag_folder
from trainer.storage import open_storage
from trainops.operators.stage import StageDatasetOperator, dataset_asset
from trainops.staging.demo_data import write_demo_dataset
from trainops.staging.errors import SourceNotFound

XCOM_KEYS = {
    "dataset_name",
    "version",
    "uri",
    "manifest_uri",
    "rows",
    "train_tokens",
    "eval_tokens",
    "reused",
    "validation_uri",
    "quarantined_rows",
}


def _op(**kwargs):
    args = {"task_id": "stage", "source_uri": "file:///nowhere", "dataset_name": "demo", "aws_conn_id": None}
    args.update(kwargs)
    return StageDatasetOperator(**args)


class _TI:
    """Records XCom pushes the way the task runner's TaskInstance takes them."""

    def __init__(self):
        self.pushed = {}

    def xcom_push(self, key, value):
        self.pushed[key] = value


def test_execute_returns_the_documented_xcom(file_root, tmp_path):
    raw = write_demo_dataset(f"file://{tmp_path}/raw", rows=400, seed=9)
    op = _op(source_uri=raw["uri"], storage_root=file_root, shard_tokens=4096)
    ti = _TI()
    result = op.execute(context={"ti": ti})
    assert json.loads(json.dumps(result)) == result
    assert set(result) == XCOM_KEYS
    assert result["dataset_name"] == "demo" and result["rows"] == 400
    assert result["uri"] == f"{file_root}/datasets/demo/{result['version']}"
    assert result["validation_uri"] == f"{result['uri']}/validation.json"
    assert result["quarantined_rows"] == 0
    assert ti.pushed == {"trainops_validation_report": result["validation_uri"]}
    manifest = open_storage(file_root).get_json(result["manifest_uri"])
    assert manifest["splits"]["train"]["tokens"] == result["train_tokens"] > 0
    assert result["reused"] is False
    assert op.execute(context={}) == dict(result, reused=True)


def test_source_on_s3_stages_into_a_file_root(s3_root, file_root):
    raw = write_demo_dataset(f"{s3_root}/raw", rows=150, seed=2, files=1)
    result = _op(source_uri=raw["uri"], storage_root=file_root).execute(context={})
    manifest = open_storage(file_root).get_json(result["manifest_uri"])
    assert manifest["source"]["objects"][0]["uri"] == raw["files"][0]
    assert result["rows"] == 150


def test_failed_validation_fails_without_retry_and_points_at_the_report(file_root, tmp_path, caplog, capsys):
    raw = write_demo_dataset(f"file://{tmp_path}/raw", rows=200, seed=9, corrupt=True)
    ti = _TI()
    with pytest.raises(AirflowFailException, match="expect_column_values_to_be_unique on 'id'"):
        _op(source_uri=raw["uri"], storage_root=file_root).execute(context={"ti": ti})
    stored = open_storage(file_root).list(file_root)
    assert len(stored) == 1 and stored[0].endswith("/validation.json")
    assert ti.pushed == {"trainops_validation_report": stored[0]}
    # the task's log names each failed expectation on a line of its own
    log = caplog.text + capsys.readouterr().out
    for line in (
        "staging rejected the data: id: expect_column_values_to_not_be_null failed for 2 rows (e.g. row 3)",
        "staging rejected the data: text: expect_column_value_lengths_to_be_between failed for 3 rows (e.g. '')",
    ):
        assert line in log, log


def test_missing_source_is_named_and_may_be_retried(file_root, tmp_path):
    missing = f"file://{tmp_path}/not-there/"
    with pytest.raises(SourceNotFound, match="not-there' does not exist"):
        _op(source_uri=missing, storage_root=file_root).execute(context={})


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"eval_percent": 0}, "eval_percent must be an integer from 1 to 50, got 0"),
        ({"eval_percent": 60}, "got 60"),
        ({"expectations": [{"type": "expect_nothing"}]}, "'expect_nothing'"),
        ({"expectations": {"type": "x"}}, "must be a list"),
        ({"expectations": "suite.json"}, "neither a list nor a file:// or s3:// URI"),
        ({"slice_columns": "source"}, "got the string 'source'"),
        ({"cluster": "slurm"}, "got 'slurm'"),
        ({"quarantine": {"max_fraction": 1.5}}, "max_fraction must be a number from 0"),
        ({"quarantine": {"fraction": 0.1}}, r"unknown keys \['fraction'\]"),
        ({"tokenizer": "tokenizer.json"}, "file:// or s3:// URI of a Hugging Face tokenizer.json"),
        (
            {"dataset_name": ".."},
            r"dataset_name '\.\.' is a path step, not a name \(it would be stored outside",
        ),
        ({"dataset_name": "."}, r"dataset_name '\.' is a path step, not a name"),
        ({"dataset_name": ""}, "dataset_name '' is empty: give the dataset a name such as 'demo'"),
        (
            {"dataset_name": "team/tickets"},
            "dataset_name 'team/tickets' holds a path separator, .*such as 'team-tickets'",
        ),
        ({"dataset_name": "t" * 300}, r"dataset_name 'tttt.*is 300 characters long; at most 128 are allowed"),
        ({"poll_interval": -1}, "poll_interval must be a positive number of seconds, got -1"),
        ({"job_options": {"memory": "-4Gi"}}, "JobSpec memory '-4Gi' is not a positive Kubernetes quantity"),
        ({"engine": "dask"}, r"engine must be one of \['worker', 'spark'\], got 'dask'"),
        ({"spark_remote": "sc://x:15002"}, "spark_remote 'sc://x:15002' is only used with engine='spark'"),
        ({"engine": "spark", "spark_remote": "x:15002"}, "must be a Spark Connect URL such as 'sc://"),
    ],
)
def test_init_rejects_bad_arguments_without_io(kwargs, message):
    with pytest.raises(ValueError, match=message):
        _op(**kwargs)


@pytest.mark.parametrize("name", ["..", ".", " ", "team/tickets", "t" * 300, "tickets\t"])
def test_a_templated_dataset_name_is_checked_before_anything_is_read_or_written(file_root, tmp_path, name):
    """``..`` used to stage into ``<root>/datasets/../<version>``, beside ``datasets/``."""
    raw = write_demo_dataset(f"file://{tmp_path}/raw", rows=100, seed=3, files=1)
    op = _op(source_uri=raw["uri"], storage_root=file_root, dataset_name="{{ params.name }}")
    op.dataset_name = name  # as rendered
    with pytest.raises(ValueError, match=re.escape(f"dataset_name {name[:40]!r}")):
        op.execute(context={})
    assert open_storage(file_root).list(file_root) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["raw"]  # nothing beside the root either


def test_templated_fields():
    assert StageDatasetOperator.template_fields == (
        "source_uri",
        "dataset_name",
        "storage_root",
        "task",
        "tokenizer",
    )


def test_a_task_and_tokenizer_given_at_run_time_are_checked_once_rendered(file_root, tmp_path):
    """A form's task and model tokenizer reach staging through an XCom or a template: checked
    when the task runs, before anything is read or written."""
    op = _op(storage_root=file_root, task="{{ params.task }}", tokenizer="{{ params.tokenizer }}")
    op.task, op.tokenizer = "translation", None  # as rendered
    with pytest.raises(
        ValueError, match=r"task 'translation' cannot be staged: pick one of causal_lm, sft, classification"
    ):
        op.execute(context={})
    op = _op(storage_root=file_root, task="{{ params.task }}", tokenizer="{{ params.tokenizer }}")
    op.task, op.tokenizer = "sft", "http://elsewhere/tokenizer.json"
    with pytest.raises(ValueError, match=r"tokenizer uri must be a file:// or s3:// URI"):
        op.execute(context={})
    assert open_storage(file_root).list(file_root) == []


def test_outlets_name_the_dataset_asset_or_an_alias_for_runtime_names():
    static = _op(dataset_name="demo text", outlets=[Asset("other")])
    assert static.outlets == [
        Asset("other"),
        Asset(
            name="trainops-dataset-demo_text~503b7c94e689", uri="trainops://datasets/demo_text~503b7c94e689"
        ),
    ]
    assert dataset_asset("demo text") == static.outlets[-1]
    templated = _op(dataset_name="{{ params.name }}")
    assert templated.outlets == [AssetAlias("trainops-datasets")]


def _asset_events(name: str) -> list[dict]:
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        rows = session.execute(
            select(AssetEvent.extra)
            .join(AssetModel, AssetEvent.asset_id == AssetModel.id)
            .where(AssetModel.name == name)
            .order_by(AssetEvent.id)
        ).all()
        return [dict(r[0]) for r in rows]


_DAG_FILE = """
import pendulum
from airflow.sdk import DAG
from trainops.operators.stage import StageDatasetOperator

with DAG({dag_id!r}, schedule=None, catchup=False, params={{"name": {runtime!r}}},
         start_date=pendulum.datetime(2026, 1, 1, tz="UTC")) as dag:
    StageDatasetOperator(task_id="static", source_uri={raw!r}, dataset_name={static!r},
                         storage_root={root!r}, aws_conn_id=None)
    StageDatasetOperator(task_id="runtime", source_uri={raw!r}, dataset_name="{{{{ params.name }}}}",
                         storage_root={root!r}, aws_conn_id=None)
"""


@pytest.mark.slow
def test_dag_run_emits_an_asset_event_with_the_version(airflow_db, file_root, tmp_path, monkeypatch):
    from trainops.cli.main import load_dag

    raw = write_demo_dataset(f"file://{tmp_path}/raw", rows=200, seed=4, files=1)
    suffix = uuid.uuid4().hex[:10]  # the metadata DB outlives this test run
    dag_id, static, runtime = f"stage_assets_{suffix}", f"static-{suffix}", f"runtime-{suffix}"
    folder = tmp_path / "dags"
    folder.mkdir()
    (folder / f"{dag_id}.py").write_text(
        _DAG_FILE.format(dag_id=dag_id, runtime=runtime, static=static, raw=raw["uri"], root=file_root)
    )

    use_dag_folder(monkeypatch, folder, "stage-assets-test")
    dagrun = load_dag(str(folder), dag_id).test()
    assert str(dagrun.state).endswith("success")
    for name in (static, runtime):
        events = _asset_events(f"trainops-dataset-{name}")
        assert len(events) == 1, (name, events)
        extra = events[0]
        assert extra["rows"] == 200 and extra["dataset_name"] == name
        assert extra["uri"] == f"{file_root}/datasets/{name}/{extra['version']}"
        assert extra["manifest_uri"] == f"{extra['uri']}/manifest.json"
        assert extra["tokens"] == extra["train_tokens"] + extra["eval_tokens"] > 0


def test_a_zero_byte_parquet_object_is_refused_before_a_staging_job_is_asked_for(
    file_root, tmp_path, monkeypatch
):
    monkeypatch.setenv("TRAINOPS_LOCAL_STATE", str(tmp_path / "local"))
    raw = write_demo_dataset(f"file://{tmp_path}/raw", rows=100, seed=3, files=1)
    open_storage(raw["uri"]).put(f"{raw['uri']}/empty.parquet", b"")
    op = _op(source_uri=raw["uri"], storage_root=file_root, job_threshold_bytes=0)  # always a job
    with pytest.raises(
        AirflowFailException, match=r"empty.parquet' are empty \(0 bytes\), which is not a Parquet file"
    ):
        op.execute(context={})
    assert not (tmp_path / "local" / "jobs").exists()  # no job launched
    assert open_storage(file_root).list(file_root) == []  # no request.json written


class _Launched(Exception):
    pass


class _RecordingBackend:
    """A cluster that records the JobSpec of a launch and stops the task there."""

    def __init__(self):
        self.specs = []

    def find(self, labels):
        return []

    def launch(self, spec):
        self.specs.append(spec)
        raise _Launched


def _staging_job_spec(tmp_path, monkeypatch, **kwargs):
    backend = _RecordingBackend()
    monkeypatch.setattr(trainops.cluster, "get_cluster", lambda name, **options: backend)
    raw = write_demo_dataset(f"file://{tmp_path}/raw", rows=50, seed=1)
    op = _op(source_uri=raw["uri"], storage_root=f"file://{tmp_path}/root", job_threshold_bytes=0, **kwargs)
    ti = SimpleNamespace(dag_id="retrain", run_id="manual__1", task_id="stage", map_index=-1, try_number=1)
    with pytest.raises(_Launched):
        op.execute({"ti": ti})
    return backend.specs[0]


def test_a_staging_job_is_sized_from_its_source_and_job_options_win(tmp_path, monkeypatch):
    spec = _staging_job_spec(tmp_path, monkeypatch)
    assert (spec.cpu, spec.memory, spec.ephemeral_storage) == ("2", "4Gi", "5Gi")  # a small source: floors
    spec = _staging_job_spec(
        tmp_path, monkeypatch, job_options={"memory": "48Gi", "ephemeral_storage": "500Gi"}
    )
    assert (spec.cpu, spec.memory, spec.ephemeral_storage) == ("2", "48Gi", "500Gi")
