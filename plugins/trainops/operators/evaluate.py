"""EvaluateModelOperator: eval loss of the candidate and of production, on the same split."""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseOperator

from trainops.hooks.storage import root_and_storage
from trainops.operators import _jobs


class EvaluateModelOperator(BaseOperator):
    """Run ``python -m trainer evaluate`` as a job on the cluster backend and defer until done.

    It evaluates the candidate (the training run's export) and, when the model already has a
    production version, that version too, on the candidate's eval split: losses on
    different splits cannot be compared. Results go to ``<run_uri>/eval/metrics.json``.

    :param training: the FSDPTrainingOperator result. (templated)
    :param model_name: the model whose production pointer is compared against. (templated)
    :param cluster: ``local`` or ``kubernetes``; where the evaluation job runs.
    :param image: the trainer image of the evaluation job (Kubernetes).
    :param namespace: Kubernetes namespace of the evaluation job.
    :param gpus_per_node: GPUs for the evaluation pod (one process; 0: CPU).
    :param capacity: ``on-demand`` (default: an evaluation is short, and a preempted one is
        simply failed) or ``spot``.
    :param job_options: further ``JobSpec`` fields for the cluster (see FSDPTrainingOperator).
    :param deferrable: wait in the triggerer (True) or in this worker slot (False). Default:
        ``[trainops] default_deferrable``, True when unset.
    :param poll_interval: seconds between job state polls in the triggerer.
    :param job_timeout: seconds the evaluation may run before the task fails and deletes it.
    :param storage_root: ``file://`` or ``s3://`` root (templated; default: the embedded root).
    :param aws_conn_id: Airflow connection for ``s3://`` storage.
    :param kubernetes_conn_id: Airflow connection for ``cluster='kubernetes'``.

    Returns ``{"metrics_uri", "run_uri", "model_name", "candidate", "production",
    "production_version"}``; ``candidate`` and ``production`` hold ``eval_loss``,
    ``perplexity``, ``tokens`` and ``slices``; ``production`` is None on the first run.
    """

    template_fields = ("training", "model_name", "storage_root")
    ui_color = "#d9e8f4"

    def __init__(
        self,
        *,
        training: Any,
        model_name: str,
        cluster: str = "local",
        image: str = "trainops-trainer:latest",
        namespace: str = "default",
        gpus_per_node: int = 0,
        capacity: str = "on-demand",
        job_options: dict | None = None,
        deferrable: bool | None = None,
        poll_interval: float = 5.0,
        job_timeout: float | None = None,
        storage_root: str | None = None,
        aws_conn_id: str | None = "aws_default",
        kubernetes_conn_id: str | None = "kubernetes_default",
        **kwargs,
    ):
        super().__init__(**kwargs)
        if capacity not in ("spot", "on-demand"):
            raise ValueError(f"capacity {capacity!r}: an evaluation runs on 'on-demand' or 'spot'")
        self.gpus_per_node, self.capacity = gpus_per_node, capacity
        self.job_options = _jobs.check_job_options(job_options)
        self.deferrable = _jobs.default_deferrable() if deferrable is None else deferrable
        self.training, self.model_name, self.cluster = training, model_name, cluster
        self.image, self.namespace = image, namespace
        self.poll_interval, self.job_timeout = poll_interval, job_timeout
        self.storage_root, self.aws_conn_id = storage_root, aws_conn_id
        self.kubernetes_conn_id = kubernetes_conn_id
        _jobs.check_renders(
            cluster,
            distributed=False,
            gpus_per_node=gpus_per_node,
            image=image,
            namespace=namespace,
            capacity=capacity,
            **self.job_options,
        )

    def _cluster_options(self) -> dict:
        return _jobs.cluster_options(self.cluster, self.kubernetes_conn_id, self.namespace)

    def execute(self, context):
        from trainer.contract import RunLayout, trainer_argv
        from trainops.cluster import get_cluster
        from trainops.cluster.spec import JobSpec
        from trainops.hooks.storage import job_env_for
        from trainops.registry.promotion import read_production
        from trainops.triggers.job import JobTrigger

        for key in ("run_uri", "config_uri", "export_uri"):
            if not isinstance(self.training, dict) or not self.training.get(key):
                raise ValueError(
                    f"training must be an FSDPTrainingOperator result with {key!r}, got {self.training!r}"
                )
        root, store = root_and_storage(self.storage_root, self.aws_conn_id)
        layout = RunLayout(self.training["run_uri"])
        production = read_production(store, root, self.model_name)
        overrides = {"eval.model_uri": self.training["export_uri"], "eval.output_uri": layout.eval_metrics}
        if production:
            overrides["eval.baseline_uri"] = production["uri"]
            self.log.info(
                "production is %s v%s: evaluating it on the same split",
                self.model_name,
                production["version"],
            )
        else:
            self.log.info("%s has no production version yet: evaluating the candidate only", self.model_name)
        identity = _jobs.task_identity(context)
        spec = JobSpec(
            name=_jobs.job_name("eval", identity, 1),
            args=trainer_argv("evaluate", self.training["config_uri"], overrides),
            nodes=1,
            gpus_per_node=self.gpus_per_node,
            distributed=False,
            image=self.image,
            namespace=self.namespace,
            capacity=self.capacity,
            **_jobs.merge_job_options(
                self.job_options, env=job_env_for(root, self.aws_conn_id), labels=_jobs.job_labels(identity)
            ),
        )
        # What is being compared, stored beside the results: the resumed operator reads it
        # back (deferral kwargs do not survive every runner) and it is lineage for later.
        store.put_json(
            self._request_uri(layout),
            {
                "candidate_uri": self.training["export_uri"],
                "production_uri": production["uri"] if production else None,
                "production_version": production["version"] if production else None,
            },
        )
        handle = get_cluster(self.cluster, **self._cluster_options()).launch(spec)
        self.log.info("evaluation job %s launched", handle["job_id"])
        trigger = JobTrigger(
            handle=handle,
            poll_interval=self.poll_interval,
            timeout=self.job_timeout,
            cluster_options=self._cluster_options(),
            stream_logs=True,
        )
        if self.deferrable:
            self.defer(trigger=trigger, method_name="execute_complete")
        return self.execute_complete(context, _jobs.wait_here(trigger))

    @staticmethod
    def _request_uri(layout) -> str:
        from trainer.contract import join

        return join(layout.run_uri, "eval", "request.json")

    def execute_complete(self, context, event: dict | None = None):
        from trainer.contract import RunLayout
        from trainops.cluster import get_cluster

        event = _jobs.check_event(event)
        cluster = get_cluster(self.cluster, **self._cluster_options())
        if event["status"] != "finished" or event["state"]["phase"] != "succeeded":
            if event["status"] != "finished":
                cluster.delete(event["handle"])
            tail = cluster.logs_tail(event["handle"], lines=20)
            raise RuntimeError(
                f"evaluation job {event['handle']['job_id']} did not succeed "
                f"({event.get('message') or event['state'].get('reason') or event['state']['phase']}).\n"
                f"Last log lines:\n{tail}"
            )
        _, store = root_and_storage(self.storage_root, self.aws_conn_id)
        layout = RunLayout(self.training["run_uri"])
        metrics = store.get_json(layout.eval_metrics)
        production_version = store.get_json(self._request_uri(layout))["production_version"]
        result = {
            "metrics_uri": layout.eval_metrics,
            "run_uri": layout.run_uri,
            "model_name": self.model_name,
            "candidate": metrics["candidate"],
            "production": metrics.get("baseline"),
            "production_version": production_version,
        }
        line = f"candidate eval_loss {metrics['candidate']['eval_loss']:.4f}"
        if result["production"]:
            line += f"; production v{production_version} eval_loss {result['production']['eval_loss']:.4f}"
        self.log.info(line)
        return result
