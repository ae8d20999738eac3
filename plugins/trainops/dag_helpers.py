"""What the example retraining DAGs share: their settings, run plans, dry runs and asset events.

The DAG files in ``dags/`` import this module when they are parsed, so at module level it uses
only the standard library, ``airflow.sdk`` and ``trainer.presets`` (plain data). Everything
heavier is imported inside the functions the tasks call. The decisions (which settings are
valid, what a run will launch, which raw data an asset event points at) are plain functions,
tested without Airflow running; docs/dags.md describes them for users.

Settings are the same nine keys wherever they come from: the ``retrain_manual`` form (DAG
params), or the ``trainops_retrain`` Variable for the unattended DAGs. Every key has a default
that runs on the embedded default (``file://`` storage, the local cluster, a tiny model).
"""

from __future__ import annotations

import re

from airflow.sdk import Asset, Param

from trainer.presets import PRESETS

__all__ = [
    "CAPACITIES", "DEMO_DATASET", "GATE_CHECKS", "RAW_DEMO_ASSET", "SETTINGS", "SETTINGS_VARIABLE",
    "SettingsError", "check_settings", "dataset_name_for", "defaults", "demo_source_uri", "deployment",
    "dry_run_report", "ensure_source", "land_demo_batch", "manual_params", "plan_run",
    "source_from_events", "train_evaluate_gate_promote", "trainer_config", "training_kwargs",
    "variable_settings",
]

CAPACITIES = ("spot", "on-demand", "spot-then-on-demand")
DEMO_DATASET = "demo-text"
# The Airflow Variable (JSON) holding the unattended DAGs' settings; any key may be left out.
SETTINGS_VARIABLE = "trainops_retrain"

# One entry per setting: its JSON schema (what the form shows and Airflow validates when a run
# is triggered), title and description. `dataset_uri`'s default depends on the storage root,
# so it is filled in by `defaults()`.
SETTINGS: dict[str, dict] = {
    "dataset_uri": {
        "schema": {"type": "string", "pattern": r"^(file:///|s3://[^/\s]+)\S*$",
                   "minLength": 8, "maxLength": 2048},
        "title": "Raw data to train on",
        "description": "Parquet, JSONL or CSV at a file:///abs/path or s3://bucket/prefix URI: "
                       "one object, a prefix or a glob. It is validated and staged before "
                       "training. The default is the demo dataset under the storage root, "
                       "generated on first use.",
    },
    "model_preset": {
        "schema": {"type": "string", "enum": list(PRESETS)},
        "default": "tiny",
        "title": "Model size",
        "description": "A built-in Llama-style preset (python -m trainer presets). 'tiny' "
                       "trains in seconds on a CPU; the larger ones need GPUs.",
    },
    "nodes": {
        "schema": {"type": "integer", "minimum": 1, "maximum": 64},
        "default": 1,
        "title": "Nodes",
        "description": "Nodes (pods) in the training gang, 1 to 64. On the local cluster "
                       "each node is a process group on this host.",
    },
    "gpus_per_node": {
        "schema": {"type": "integer", "minimum": 0, "maximum": 16},
        "default": 0,
        "title": "GPUs per node",
        "description": "0 to 16. 0 trains on CPU, one process per node (gloo); the local "
                       "cluster has no GPUs unless this host has them.",
    },
    "capacity": {
        "schema": {"type": "string", "enum": list(CAPACITIES)},
        "default": "spot",
        "title": "Capacity",
        "description": "spot (cheap, can be preempted: the job resumes from its last "
                       "checkpoint), on-demand, or spot-then-on-demand (moves to on-demand "
                       "after repeated preemptions).",
    },
    "max_preemptions": {
        "schema": {"type": "integer", "minimum": 0, "maximum": 100},
        "default": 3,
        "title": "Preemption budget",
        "description": "Relaunches after spot preemptions before the training task fails, "
                       "0 to 100. Separate from Airflow's task retries.",
    },
    "lr": {
        "schema": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
        "default": 0.003,
        "title": "Learning rate",
        "description": "Peak AdamW learning rate, above 0 and at most 1; linear warmup, then "
                       "cosine decay to a tenth of it.",
    },
    "max_steps": {
        "schema": {"type": "integer", "minimum": 1, "maximum": 1_000_000},
        "default": 60,
        "title": "Training steps",
        "description": "Optimizer steps, 1 to 1,000,000. The default trains the tiny model "
                       "in seconds.",
    },
    "dry_run": {
        "schema": {"type": "boolean"},
        "default": False,
        "title": "Dry run",
        "description": "Only render what would be launched (the job spec, the resolved "
                       "trainer config and the Kubernetes manifests) into the task log; "
                       "stage, train, evaluate and promote nothing.",
    },
}

# The gate every example DAG applies: an absolute bound well below an untrained model's loss
# (ln 257 = 5.55 with the byte tokenizer), and no regression against production.
GATE_CHECKS = [
    {"name": "eval loss under 3.5", "kind": "threshold", "metric": "eval_loss", "op": "<=",
     "value": 3.5},
    {"name": "no regression vs production", "kind": "no_regression", "metric": "eval_loss",
     "tolerance": 0.02},
]

# The raw data a data team lands (dags/data_team_publish.py) and retrain_on_new_data is
# scheduled on. The URI names the feed, not a location: each event's extra carries the
# snapshot's storage URI.
RAW_DEMO_ASSET = Asset(name="datateam-raw-demo-text", uri="datateam://raw/demo-text")


class SettingsError(ValueError):
    """A setting is unknown or invalid; the message names it."""


# --------------------------------------------------------------------------- settings
def demo_source_uri(root: str | None = None) -> str:
    """``<storage root>/raw/demo-text``: where the demo data lives (the demo DAG's too)."""
    from trainer.contract import join
    from trainops.settings import resolve_storage_root

    return join(resolve_storage_root(root), "raw", DEMO_DATASET)


def defaults(root: str | None = None) -> dict:
    """Every setting's default value; ``dataset_uri`` is the demo data under the storage root."""
    values = {key: spec.get("default") for key, spec in SETTINGS.items()}
    values["dataset_uri"] = demo_source_uri(root)
    return values


def manual_params(root: str | None = None) -> dict[str, Param]:
    """The ``retrain_manual`` form: one Param per setting, with title, description and schema."""
    values = defaults(root)
    return {key: Param(values[key], title=spec["title"], description=spec["description"],
                       **spec["schema"])
            for key, spec in SETTINGS.items()}


def check_settings(values: dict | None, *, source: str, allowed=tuple(SETTINGS),
                   root: str | None = None) -> dict:
    """``values`` over the defaults, validated against the settings' schemas.

    An unknown key (with the nearest known one) or an invalid value raises SettingsError
    naming ``source`` and the key. Airflow checks a triggered run's params itself, but it
    accepts keys it does not know, and Variables are not checked at all.
    """
    import difflib

    import jsonschema

    values = dict(values or {})
    unknown = sorted(set(values) - set(allowed))
    if unknown:
        hints = [f"{k!r}" + (f" (did you mean {close[0]!r}?)"
                             if (close := difflib.get_close_matches(k, allowed, n=1)) else "")
                 for k in unknown]
        raise SettingsError(f"{source}: unknown setting(s) {', '.join(hints)}; known settings: "
                            f"{', '.join(allowed)}")
    merged = {**{k: v for k, v in defaults(root).items() if k in allowed}, **values}
    for key, value in merged.items():
        try:
            jsonschema.validate(value, SETTINGS[key]["schema"])
        except jsonschema.ValidationError as exc:
            raise SettingsError(f"{source}: {key}={value!r} is invalid: {exc.message}") from None
    return merged


def dataset_name_for(uri: str) -> str:
    """The dataset name staging files a raw URI under: its last path segment before any glob
    (``s3://raw/tickets/2026-*/*.parquet`` -> ``tickets``; ``.../demo-text`` -> ``demo-text``),
    without a file extension."""
    path = uri.split("://", 1)[-1]
    segments = [s for s in path.split("/") if s]
    segments = segments[1:] if uri.startswith("s3://") else segments  # not the bucket
    plain = []
    for segment in segments:
        if any(c in segment for c in "*?["):
            break
        plain.append(segment)
    if not plain:
        raise SettingsError(f"cannot name a dataset after {uri!r}: give a prefix with at least "
                            "one path segment before any glob (s3://bucket/name/...)")
    name = re.sub(r"\.(parquet|jsonl|json|csv)$", "", plain[-1])
    return re.sub(r"[^A-Za-z0-9._=-]", "_", name)


def trainer_config(model_preset: str, lr: float, max_steps: int) -> dict:
    """The trainer config for a retraining run: small batches of 64-token windows, bf16,
    a warmup of a tenth of the run (at most 100 steps), a checkpoint every quarter of the run
    (every 10 to 200 steps), so a preemption costs at most that many steps."""
    return {
        "precision": "bf16",
        "model": {"preset": model_preset},
        "train": {"max_steps": max_steps, "micro_batch_size": 8, "seq_len": 64, "lr": lr,
                  "warmup_steps": min(100, max_steps // 10)},
        "checkpoint": {"every_steps": min(200, max(10, max_steps // 4)), "keep": 2},
        "metrics": {"flush_every": min(10, max_steps)},
    }


def training_kwargs(settings: dict) -> dict:
    """The training operator's run-time arguments (templated fields, fed from the plan task's
    XCom): ``nodes``, ``gpus_per_node``, ``capacity``, ``max_preemptions``, ``trainer_config``."""
    return {
        "nodes": settings["nodes"],
        "gpus_per_node": settings["gpus_per_node"],
        "capacity": settings["capacity"],
        "max_preemptions": settings["max_preemptions"],
        "trainer_config": trainer_config(settings["model_preset"], settings["lr"],
                                         settings["max_steps"]),
    }


def plan_run(settings: dict) -> dict:
    """What a run will do, from checked settings: the raw data, the dataset name it is staged
    as, whether it is a dry run, and the training arguments (:func:`training_kwargs`)."""
    return {
        "dataset_uri": settings["dataset_uri"],
        "dataset_name": dataset_name_for(settings["dataset_uri"]),
        "dry_run": bool(settings.get("dry_run", False)),
        **training_kwargs(settings),
    }


def variable_settings(*, allowed) -> dict:
    """The ``trainops_retrain`` Variable (JSON; absent: all defaults), checked like the form:
    only ``allowed`` keys, each valid. Called in a task, never at parse time."""
    from airflow.sdk import Variable

    value = Variable.get(SETTINGS_VARIABLE, default=None, deserialize_json=True)
    if value is not None and not isinstance(value, dict):
        raise SettingsError(f"Variable {SETTINGS_VARIABLE}: expected a JSON object of settings, "
                            f"got {value!r}")
    return check_settings(value, source=f"Variable {SETTINGS_VARIABLE}", allowed=allowed)


def deployment() -> dict:
    """Where jobs run, read when a DAG is parsed from ``[trainops]`` in Airflow's config
    (``AIRFLOW__TRAINOPS__CLUSTER`` ...): ``cluster`` (``local``), ``image``, ``namespace``,
    and the job poll interval that suits the cluster (1 s for local processes, 5 s for the
    Kubernetes API). A deployment choice, not a per-run one: every task of a run must agree
    on it."""
    from airflow.configuration import conf

    cluster = conf.get("trainops", "cluster", fallback="local")
    return {"cluster": cluster,
            "image": conf.get("trainops", "image", fallback="trainops-trainer:latest"),
            "namespace": conf.get("trainops", "namespace", fallback="default"),
            "poll_interval": 1.0 if cluster == "local" else 5.0}


def train_evaluate_gate_promote(stage, args, *, model: str, place: dict, **train_options) -> dict:
    """What every retraining DAG shares, created in the DAG being defined: train on
    ``stage``'s dataset with the run-time settings ``args`` (an XCom dict with ``nodes``,
    ``gpus_per_node``, ``capacity``, ``max_preemptions``, ``trainer_config``), evaluate the
    candidate against production, gate it (:data:`GATE_CHECKS`) and promote it. ``place`` is
    :func:`deployment`'s answer. Returns the four tasks by task id."""
    from trainops.operators import (
        EvaluateModelOperator,
        EvaluationGateOperator,
        FSDPTrainingOperator,
        PromoteModelOperator,
    )

    where = {key: place[key] for key in ("cluster", "image", "namespace", "poll_interval")}
    # No Airflow retries for training: preemptions and infrastructure failures have their own
    # budgets inside the task, and a program error would fail the same way again.
    train = FSDPTrainingOperator(
        task_id="train", dataset=stage.output, nodes=args["nodes"],
        gpus_per_node=args["gpus_per_node"], capacity=args["capacity"],
        max_preemptions=args["max_preemptions"], trainer_config=args["trainer_config"],
        retries=0, **where, **train_options)
    evaluate = EvaluateModelOperator(task_id="evaluate", training=train.output, model_name=model,
                                     **where)
    gate = EvaluationGateOperator(task_id="gate", evaluation=evaluate.output, checks=GATE_CHECKS)
    promote = PromoteModelOperator(task_id="promote", model_name=model, gate=gate.output,
                                   training=train.output, dataset=stage.output,
                                   evaluation=evaluate.output)
    return {"train": train, "evaluate": evaluate, "gate": gate, "promote": promote}


# --------------------------------------------------------------------------- data
def ensure_source(uri: str, *, aws_conn_id: str | None = "aws_default", log=None) -> str:
    """``uri``, after writing the demo dataset there if ``uri`` is the storage root's demo
    location and holds nothing yet. Any other URI is returned as is (staging checks it)."""
    from trainops.storage_conn import storage_for

    if uri.rstrip("/") != demo_source_uri():
        return uri
    store = storage_for(uri, aws_conn_id)
    if store.list(uri):
        return uri
    from trainops.staging.demo_data import write_demo_dataset

    written = write_demo_dataset(uri, rows=4000, seed=0, storage=store)
    if log:
        log.info("no data at %s yet: wrote the demo dataset (%d rows)", uri, written["rows"])
    return uri


def land_demo_batch(root: str, batch: str, *, seed: int, rows: int = 4000,
                    aws_conn_id: str | None = "aws_default") -> dict:
    """Write one snapshot of demo data to ``<root>/raw/datateam/demo-text/<batch>``; return
    the asset event's extra: ``{"uri", "rows", "dataset_name", "format"}``."""
    from trainer.contract import join, safe_segment
    from trainops.staging.demo_data import write_demo_dataset
    from trainops.storage_conn import storage_for

    uri = join(root, "raw", "datateam", DEMO_DATASET, safe_segment(batch))
    written = write_demo_dataset(uri, rows=rows, seed=seed, storage=storage_for(root, aws_conn_id))
    return {"uri": written["uri"], "rows": written["rows"], "dataset_name": DEMO_DATASET,
            "format": "parquet"}


def source_from_events(events, fallback_uri: str | None = None) -> dict:
    """Which raw data a run triggered by asset events should stage.

    ``events`` maps each asset to its events (Airflow's ``triggering_asset_events``); each
    event has ``extra`` (``uri``, optional ``rows`` and ``dataset_name``) and ``timestamp``.
    Each event announces a complete snapshot, so when several arrived before the run started
    the newest one wins and the others are reported as superseded. Without any event (a
    manual run), ``fallback_uri`` is used. Returns ``{"uri", "dataset_name", "rows",
    "from_event", "superseded"}``.
    """
    found = [e for batch in (events or {}).values() for e in batch
             if isinstance(getattr(e, "extra", None), dict) and e.extra.get("uri")]
    if not found:
        if not fallback_uri:
            seen = sum(len(batch) for batch in (events or {}).values())
            raise ValueError(f"nothing to stage: {seen} triggering asset event(s) and none has "
                             "'uri' in its extra; a manual run must set the dataset_uri param")
        return {"uri": fallback_uri, "dataset_name": dataset_name_for(fallback_uri),
                "rows": None, "from_event": None, "superseded": []}
    found.sort(key=lambda e: e.timestamp)
    newest = found[-1]
    extra = newest.extra
    return {
        "uri": extra["uri"],
        "dataset_name": extra.get("dataset_name") or dataset_name_for(extra["uri"]),
        "rows": extra.get("rows"),
        "from_event": {"asset": getattr(newest.asset, "name", None),
                       "source_dag_id": getattr(newest, "source_dag_id", None),
                       "source_run_id": getattr(newest, "source_run_id", None),
                       "timestamp": newest.timestamp.isoformat()},
        "superseded": [e.extra["uri"] for e in found[:-1]],
    }


# --------------------------------------------------------------------------- dry run
def dry_run_report(plan: dict, *, dag_id: str, run_id: str, storage_root: str | None = None,
                   aws_conn_id: str | None = "aws_default") -> dict:
    """What the training task would launch for ``plan``, launching nothing: the resolved
    trainer config (validated by the trainer's own schema), attempt 1's JobSpec, and the
    Kubernetes manifests that JobSpec becomes (what ``cluster='kubernetes'`` submits; the
    local cluster runs the same arguments as process groups on this host)."""
    from trainer.contract import ENV_ATTEMPT, join, run_prefix, safe_segment, trainer_argv
    from trainops.cluster.k8s_render import render_manifests
    from trainops.cluster.spec import JobSpec
    from trainops.operators import _jobs
    from trainops.settings import resolve_storage_root
    from trainops.storage_conn import job_env_for

    import yaml

    place = deployment()
    root = resolve_storage_root(storage_root)
    kwargs = plan
    identity = {"dag_id": dag_id, "run_id": run_id, "task_id": "train", "map_index": -1}
    run_uri = run_prefix(root, dag_id, run_id, "train")
    data_uri = join(root, "datasets", safe_segment(plan["dataset_name"]),
                    "<version staged from dataset_uri>")
    world_size = kwargs["nodes"] * max(1, kwargs["gpus_per_node"])
    config = _jobs.resolve_trainer_config(
        {"run_uri": run_uri, "data_uri": data_uri, **kwargs["trainer_config"]}, world_size)
    labels = {**_jobs.job_labels(identity), "trainops/attempt": "1"}
    env = {**job_env_for(run_uri, aws_conn_id), ENV_ATTEMPT: "1"}
    spec = JobSpec(name=_jobs.job_name("train", identity, 1),
                   args=trainer_argv("train", f"{run_uri}/config.yaml"),
                   nodes=kwargs["nodes"], gpus_per_node=kwargs["gpus_per_node"],
                   distributed=True, image=place["image"], namespace=place["namespace"],
                   capacity=kwargs["capacity"], env=env, labels=labels)
    return {"cluster": place["cluster"], "dataset_uri": plan["dataset_uri"],
            "max_preemptions": kwargs["max_preemptions"], "capacity": kwargs["capacity"],
            "trainer_config": yaml.safe_load(config), "job_spec": spec.to_dict(),
            "manifests": render_manifests(spec)}
