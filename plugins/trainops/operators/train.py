"""FSDPTrainingOperator: run the FSDP trainer on a cluster and carry it through preemptions."""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseOperator

from trainops.hooks.storage import root_and_storage
from trainops.links import RUN_REPORT_KEY, RunReportLink
from trainops.operators import _jobs


class FSDPTrainingOperator(BaseOperator):
    """Train with the trainops FSDP trainer (torchrun) and relaunch it after every preemption.

    The operator writes the resolved ``config.yaml`` under the run prefix
    ``<storage_root>/runs/<dag_id>/<run_id>/<task_id>``, launches ``nodes`` x ``gpus_per_node``
    workers on ``cluster`` and defers while they run. When an attempt ends it reads the
    trainer's attempt record and the cluster's view, classifies the attempt (succeeded,
    preempted, infra, error) and either finishes, relaunches (the trainer resumes from the last
    committed checkpoint under the same prefix) or fails with the trainer's hint and log tail.
    Every attempt is recorded in ``job.json``. Preemptions have their own budget
    (``max_preemptions``), separate from Airflow's ``retries``.

    :param dataset: the StageDatasetOperator result (its ``uri`` is the trainer's ``data_uri``)
        or a dataset version URI. (templated)
    :param trainer_config: trainer settings, nested (``{"train": {"lr": 1e-3}}``) or dotted
        (``{"train.lr": 1e-3}``); see ``python -m trainer train --help``. (templated)
    :param nodes: number of nodes; each runs one torchrun agent. (templated)
    :param gpus_per_node: GPUs per node; 0 runs one CPU process per node (gloo). (templated)
    :param cluster: ``local`` (this host; the embedded default) or ``kubernetes``.
    :param capacity: ``spot``, ``on-demand`` or ``spot-then-on-demand``. (templated)
    :param max_preemptions: relaunches allowed after preemptions before the task fails.
        (templated; a templated sizing setting is checked when the task runs, a plain one when
        the DAG is parsed)
    :param max_infra_retries: relaunches allowed after infrastructure failures (image pull,
        no node found), each after a back-off of 30 s doubling up to 10 min.
    :param fallback_after: with ``spot-then-on-demand``, preemptions before moving to on-demand.
        The move also happens when spot pods stay unschedulable past ``unschedulable_timeout``.
    :param unschedulable_timeout: seconds (Kubernetes) pods may wait for a node before the
        attempt ends as an infrastructure failure, or, with ``spot-then-on-demand``, before
        the job moves to on-demand. A job that Kueue holds suspended is queued, not waiting.
    :param termination_grace_seconds: SIGTERM-to-SIGKILL time: the emergency checkpoint's budget.
    :param image: the trainer image (Kubernetes).
    :param namespace: Kubernetes namespace of the jobs.
    :param job_options: further ``JobSpec`` fields for the cluster, checked when the DAG is
        parsed: ``kind``, ``scheduler``, ``spot_flavour``, ``cpu``, ``memory``, ``shm_size``,
        ``env``, ``env_from_secrets``, ``service_account``, ``labels``, ``annotations``,
        ``node_selector``, ``tolerations``, ``affinity``, ``priority_class``, ``nccl_env``,
        ``cluster_domain``, ``runtime`` (see docs/kubernetes.md).
    :param deferrable: wait in the triggerer (True) or in this worker slot (False). Default:
        ``[trainops] default_deferrable``, True when unset.
    :param inject_preemption: local cluster only, for demos and tests: ``{"node": 1,
        "at_step": 40}`` sends SIGTERM to that node's torchrun once attempt 1 reaches the step.
    :param poll_interval: seconds between job state polls in the triggerer.
    :param progress_every: seconds between progress lines (step, loss, tokens/s) in the task log.
    :param job_timeout: seconds an attempt may run before the task fails and deletes it.
    :param storage_root: ``file://`` or ``s3://`` root (templated; default: the embedded root).
    :param aws_conn_id: Airflow connection for ``s3://`` storage.
    :param kubernetes_conn_id: Airflow connection for ``cluster='kubernetes'``.
    """

    template_fields = (
        "dataset",
        "trainer_config",
        "storage_root",
        "nodes",
        "gpus_per_node",
        "capacity",
        "max_preemptions",
    )
    ui_color = "#f4d9c6"
    operator_extra_links = (RunReportLink(),)

    def __init__(
        self,
        *,
        dataset: Any,
        trainer_config: dict | None = None,
        nodes: int = 1,
        gpus_per_node: int = 0,
        cluster: str = "local",
        capacity: str = "spot",
        max_preemptions: int = 3,
        max_infra_retries: int = 2,
        fallback_after: int | None = None,
        unschedulable_timeout: float = 900,
        image: str = "trainops-trainer:latest",
        namespace: str = "default",
        termination_grace_seconds: int = 60,
        job_options: dict | None = None,
        deferrable: bool | None = None,
        inject_preemption: dict | None = None,
        poll_interval: float = 5.0,
        progress_every: float = 30.0,
        job_timeout: float | None = None,
        storage_root: str | None = None,
        aws_conn_id: str | None = "aws_default",
        kubernetes_conn_id: str | None = "kubernetes_default",
        **kwargs,
    ):
        super().__init__(**kwargs)
        from trainops.cluster import CLUSTERS

        if cluster not in CLUSTERS:
            raise ValueError(f"cluster {cluster!r} is not one of {CLUSTERS}")
        if inject_preemption is not None and cluster != "local":
            raise ValueError("inject_preemption works only with cluster='local' (a demo and test aid)")
        self.job_options = _jobs.check_job_options(job_options)
        self.deferrable = _jobs.default_deferrable() if deferrable is None else deferrable
        self.dataset = dataset
        self.trainer_config = trainer_config or {}
        self.nodes, self.gpus_per_node, self.cluster = nodes, gpus_per_node, cluster
        self.capacity, self.fallback_after = capacity, fallback_after
        self.max_preemptions, self.max_infra_retries = max_preemptions, max_infra_retries
        self.image, self.namespace = image, namespace
        self.termination_grace_seconds = termination_grace_seconds
        self.inject_preemption = inject_preemption
        self.poll_interval, self.job_timeout = poll_interval, job_timeout
        self.progress_every = progress_every
        self.storage_root, self.aws_conn_id = storage_root, aws_conn_id
        self.kubernetes_conn_id = kubernetes_conn_id
        self.unschedulable_timeout = unschedulable_timeout
        if not any(_jobs.known_at_run_time(v) for v in (nodes, gpus_per_node, capacity, max_preemptions)):
            self._check_settings()  # else when the task runs, once the templates are rendered

    def _check_settings(self) -> None:
        """Check (and, from rendered templates, convert) the sizing settings; on Kubernetes,
        render a trial JobSpec too. At DAG parse for plain values, else when the task runs."""
        self.nodes = _jobs.as_int("nodes", self.nodes, minimum=1)
        self.gpus_per_node = _jobs.as_int("gpus_per_node", self.gpus_per_node, minimum=0)
        self.max_preemptions = _jobs.as_int("max_preemptions", self.max_preemptions, minimum=0)
        if self.capacity not in ("spot", "on-demand", "spot-then-on-demand"):
            raise ValueError(
                f"capacity {self.capacity!r} is not one of 'spot', 'on-demand', 'spot-then-on-demand'"
            )
        _jobs.check_renders(
            self.cluster,
            nodes=self.nodes,
            gpus_per_node=self.gpus_per_node,
            image=self.image,
            namespace=self.namespace,
            capacity=self.capacity,
            termination_grace_seconds=self.termination_grace_seconds,
            **self.job_options,
        )

    # -- helpers -----------------------------------------------------------------------
    def _cluster_options(self) -> dict:
        return _jobs.cluster_options(
            self.cluster, self.kubernetes_conn_id, self.namespace, self.unschedulable_timeout
        )

    def _cluster(self):
        from trainops.cluster import get_cluster

        return get_cluster(self.cluster, **self._cluster_options())

    def _data_uri(self) -> str:
        uri = self.dataset.get("uri") if isinstance(self.dataset, dict) else self.dataset
        if not isinstance(uri, str) or not uri:
            raise ValueError(
                f"dataset must be a StageDatasetOperator result or a dataset URI, got {self.dataset!r}"
            )
        return uri

    # -- execute -----------------------------------------------------------------------
    def execute(self, context):
        from trainer.contract import RunLayout, run_prefix

        self._check_settings()
        identity = _jobs.task_identity(context)
        root, store = root_and_storage(self.storage_root, self.aws_conn_id)
        run_uri = run_prefix(
            root, identity["dag_id"], identity["run_id"], identity["task_id"], identity["map_index"]
        )
        layout = RunLayout(run_uri)
        user = _jobs.nest(self.trainer_config)
        for key in ("run_uri", "data_uri"):
            if key in user:
                raise ValueError(
                    f"trainer_config must not set {key!r}: the operator derives it "
                    "from the run prefix and the dataset"
                )
        base = {"run_uri": run_uri, "data_uri": self._data_uri(), **user}
        world_size = self.nodes * max(1, self.gpus_per_node)
        resolved = _jobs.resolve_trainer_config(base, world_size)  # bad config fails here, before any launch
        store.put(layout.config, resolved.encode())
        self.log.info("trainer config written to %s", layout.config)

        job = self._read_job(store, layout) or {
            "run_uri": run_uri,
            "config_uri": layout.config,
            "cluster": self.cluster,
            "capacity": self.capacity,
            "preemptions": 0,
            "infra_failures": 0,
            "status": "running",
            "attempts": [],
        }
        if callable(getattr(context.get("ti"), "xcom_push", None)):  # the "Training report" link,
            context["ti"].xcom_push(key=RUN_REPORT_KEY, value=layout.job)  # on a reattach too
        cluster = self._cluster()
        self._labels = _jobs.job_labels(identity)
        live = cluster.find(self._labels)
        if live:
            self.log.info("reattaching to live job %s instead of launching a second one", live[0]["job_id"])
            return self._wait(context, live[0], layout.metrics)
        return self._launch(context, store, layout, job, identity)

    def _read_job(self, store, layout) -> dict | None:
        from trainer.storage import NotFound

        try:
            return store.get_json(layout.job)
        except NotFound:
            return None

    def _launch(self, context, store, layout, job: dict, identity: dict):
        from trainer.contract import ENV_ATTEMPT, trainer_argv
        from trainops.cluster.spec import JobSpec
        from trainops.hooks.storage import job_env_for

        attempt = len(job["attempts"]) + 1
        labels = {**_jobs.job_labels(identity), "trainops/attempt": str(attempt)}
        env = {**job_env_for(layout.run_uri, self.aws_conn_id), ENV_ATTEMPT: str(attempt)}
        spec = JobSpec(
            name=_jobs.job_name("train", identity, attempt),
            args=trainer_argv("train", layout.config),
            nodes=self.nodes,
            gpus_per_node=self.gpus_per_node,
            distributed=True,
            image=self.image,
            namespace=self.namespace,
            capacity=job["capacity"],
            termination_grace_seconds=self.termination_grace_seconds,
            **_jobs.merge_job_options(self.job_options, env=env, labels=labels),
        )
        chaos = None
        if self.inject_preemption and int(self.inject_preemption.get("attempt", 1)) == attempt:
            chaos = {"node": 0, **self.inject_preemption, "attempt": attempt, "metrics_uri": layout.metrics}
        cluster = self._cluster()
        handle = cluster.launch(spec, chaos=chaos) if chaos else cluster.launch(spec)
        job["attempts"].append(
            {
                "attempt": attempt,
                "job": handle,
                "capacity": job["capacity"],
                "nodes": self.nodes,
                "gpus_per_node": self.gpus_per_node,
                "args": spec.args,
                "spec": spec.to_dict(),
                "manifests": _jobs.manifests_of(self.cluster, spec),
                "launched_at": _jobs.now_iso(),
            }
        )
        store.put_json(layout.job, job)
        self.log.info(
            "attempt %d: launched %s (%d node(s) x %d process(es), %s capacity)%s",
            attempt,
            handle["job_id"],
            self.nodes,
            spec.procs_per_node,
            job["capacity"],
            f"; will inject a preemption at step {chaos['at_step']}" if chaos else "",
        )
        return self._wait(context, handle, layout.metrics)

    def _wait(self, context, handle: dict, metrics_uri: str):
        """Wait for the attempt: in the triggerer (deferrable) or here, then decide."""
        from trainops.triggers.job import JobTrigger

        trigger = JobTrigger(
            handle=handle,
            poll_interval=self.poll_interval,
            timeout=self.job_timeout,
            progress_uri=metrics_uri,
            progress_every=self.progress_every,
            aws_conn_id=self.aws_conn_id,
            cluster_options=self._cluster_options(),
            stream_logs=True,
        )
        if self.deferrable:
            self.defer(trigger=trigger, method_name="execute_complete")
        return self.execute_complete(context, _jobs.wait_here(trigger))

    def _retire(self, context, handle: dict, delay_s: float | None):
        """Delete the attempt's job; relaunch once every pod of it is gone (and any back-off
        is over): no old pod may still be writing its emergency checkpoint."""
        import time

        from trainops.triggers.job import JobGoneTrigger

        self._cluster().delete(handle)
        trigger = JobGoneTrigger(
            handle=handle,
            cluster_options=self._cluster_options(),
            not_before=time.time() + delay_s if delay_s else None,
            deadline_s=self.termination_grace_seconds + 120,
        )
        if self.deferrable:
            self.defer(trigger=trigger, method_name="relaunch_when_gone")
        return self.relaunch_when_gone(context, _jobs.wait_here(trigger))

    # -- after each attempt ------------------------------------------------------------
    def execute_complete(self, context, event: dict | None = None):
        from trainer.contract import RunLayout, run_prefix
        from trainops.recovery.classify import INFRA, PREEMPTED, classify_attempt
        from trainops.recovery.policy import decide, is_capacity_fallback

        event = _jobs.check_event(event)
        if event["status"] == "gone":
            raise RuntimeError(f"unexpected trigger event {event!r} for execute_complete")
        self._check_settings()
        identity = _jobs.task_identity(context)
        root, store = root_and_storage(self.storage_root, self.aws_conn_id)
        layout = RunLayout(
            run_prefix(
                root, identity["dag_id"], identity["run_id"], identity["task_id"], identity["map_index"]
            )
        )
        job = self._read_job(store, layout)
        entry = job["attempts"][-1]
        cluster = self._cluster()
        if event["status"] != "finished":
            cluster.delete(event["handle"])
            entry.update(ended_at=_jobs.now_iso(), classification="error", reason=event.get("message"))
            job["status"] = "failed"
            store.put_json(layout.job, job)
            raise RuntimeError(
                f"training attempt {entry['attempt']} {event['status']}: "
                f"{event.get('message')}; the job was deleted"
            )

        state = event["state"]
        record = self._read_record(store, layout, entry["attempt"])
        verdict = classify_attempt(state, record)
        fallback = is_capacity_fallback(verdict["classification"], state, job["capacity"])
        job["preemptions"] += verdict["classification"] == PREEMPTED
        job["infra_failures"] += verdict["classification"] == INFRA and not fallback
        decision = decide(
            verdict["classification"],
            preemptions=job["preemptions"],
            max_preemptions=self.max_preemptions,
            infra_failures=job["infra_failures"],
            max_infra_retries=self.max_infra_retries,
            capacity=job["capacity"],
            fallback_after=self.fallback_after,
            unschedulable=bool(state.get("unschedulable")),
        )
        entry.update(
            ended_at=_jobs.now_iso(),
            state=state,
            record=record,
            steps_lost=self._steps_lost(store, layout, entry["attempt"], record),
            node_types=_jobs.node_types(state),
            decision=decision,
            **verdict,
        )
        self.log.info(
            "attempt %d: %s (%s); %s",
            entry["attempt"],
            verdict["classification"],
            verdict["reason"],
            decision["reason"],
        )
        if decision["action"] == "relaunch":
            job["capacity"] = decision["capacity"]
            store.put_json(layout.job, job)
            return self._retire(context, event["handle"], decision.get("delay_s"))
        job["status"] = "succeeded" if decision["action"] == "finish" else "failed"
        store.put_json(layout.job, job)
        if decision["action"] == "fail":
            tail = cluster.logs_tail(event["handle"], lines=20)
            raise RuntimeError(
                f"training failed on attempt {entry['attempt']}: {verdict['reason']}. "
                f"{decision['reason']}.\nLast log lines:\n{tail}"
            )
        return self._result(store, layout, job, record)

    def relaunch_when_gone(self, context, event=None):
        """The old attempt's pods are gone (and any back-off is over): launch the next attempt."""
        from trainer.contract import RunLayout, run_prefix

        event = _jobs.check_event(event)
        self._check_settings()
        identity = _jobs.task_identity(context)
        root, store = root_and_storage(self.storage_root, self.aws_conn_id)
        layout = RunLayout(
            run_prefix(
                root, identity["dag_id"], identity["run_id"], identity["task_id"], identity["map_index"]
            )
        )
        job = self._read_job(store, layout)
        if event["status"] != "gone":
            job["status"] = "failed"
            store.put_json(layout.job, job)
            raise RuntimeError(f"not relaunching: {event.get('message') or event['status']}")
        self._labels = _jobs.job_labels(identity)
        return self._launch(context, store, layout, job, identity)

    def _read_record(self, store, layout, attempt: int) -> dict | None:
        from trainer.contract import parse_attempt_record
        from trainer.storage import NotFound

        try:
            return parse_attempt_record(store.get_json(layout.attempt(attempt)))
        except NotFound:
            return None
        except ValueError as exc:
            self.log.warning("ignoring a malformed attempt record: %s", exc)
            return None

    @staticmethod
    def _steps_lost(store, layout, attempt: int, record: dict | None) -> int:
        """From the record, or (no record: SIGKILL) from metrics vs the latest committed step."""
        if record is not None:
            return record["steps_lost"]
        from trainer.contract import max_step_of_attempt, metrics_records
        from trainer.storage import NotFound

        try:
            last = max_step_of_attempt(metrics_records(store.get(layout.metrics).decode()), attempt)
        except NotFound:
            return 0
        try:
            committed = int(store.get_json(layout.latest).get("step", 0))
        except NotFound:
            committed = 0
        return max(0, last - committed)

    @staticmethod
    def _result(store, layout, job: dict, record: dict) -> dict:
        from trainer.contract import metrics_by_step, metrics_records
        from trainer.storage import NotFound

        try:
            by_step = metrics_by_step(metrics_records(store.get(layout.metrics).decode()))
        except NotFound:
            by_step = {}
        final_loss = by_step[max(by_step)]["loss"] if by_step else None
        return {
            "run_uri": layout.run_uri,
            "config_uri": layout.config,
            "job_uri": layout.job,
            "export_uri": layout.export,
            "metrics_uri": layout.metrics,
            "steps": record["last_step"],
            "checkpoint_step": record["checkpoint_step"],
            "attempts": len(job["attempts"]),
            "preemptions": job["preemptions"],
            "steps_lost": sum(a.get("steps_lost") or 0 for a in job["attempts"]),
            "final_loss": final_loss,
        }

    def on_kill(self) -> None:
        """Killing the task deletes its live job (all nodes), so nothing trains unwatched."""
        try:
            labels = getattr(self, "_labels", None)
            if not labels:
                return
            cluster = self._cluster()
            for handle in cluster.find(labels):
                cluster.delete(handle)
        except Exception:  # best effort: on_kill must not raise
            self.log.exception("could not delete the training job")
