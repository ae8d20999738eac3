"""EvaluateModelOperator: eval loss of the candidate and of production, on the same split."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow.sdk.exceptions import AirflowFailException

from trainer.config import ConfigError, check_user_metrics
from trainer.contract import RunLayout, join, trainer_argv
from trainer.storage import NotFound, Storage
from trainops.cluster.base import JobAlreadyExists
from trainops.cluster.spec import CAPACITIES
from trainops.gate.metrics import shown_metrics
from trainops.hooks.storage import get_json_object, job_env_for, root_and_storage, storage_for
from trainops.operators.base import DEFAULT_IMAGE, ClusterJobOperator, task_identity
from trainops.operators.deadlines import waiting_failed
from trainops.operators.eval_sizing import eval_pod
from trainops.operators.fail_fast import fail_fast
from trainops.operators.job_options import check_renders
from trainops.operators.launch_plan import one_process_job
from trainops.operators.params import as_int, known_at_run_time, name_param, optional_seconds
from trainops.operators.preflight import check_gpus, check_scorers, dataset_manifest
from trainops.operators.sizing import model_params
from trainops.operators.train_launch import run_config
from trainops.registry.errors import MalformedPointer, RegistryNameConflict
from trainops.registry.promotion import read_production
from trainops.triggers.events import check_event

if TYPE_CHECKING:
    from trainer.contract import RunLayout

# An evaluation is one short job that is never relaunched, so a capacity that changes between
# attempts (spot-then-on-demand) means nothing for it.
EVALUATION_CAPACITIES = tuple(c for c in CAPACITIES if c != "spot-then-on-demand")


class EvaluateModelOperator(ClusterJobOperator):
    """Run ``python -m trainer evaluate`` as a job on the cluster backend and defer until done.

    It evaluates the candidate (the training run's export) and, when the model already has a
    production version, that version too, on the candidate's eval split: losses on
    different splits cannot be compared. Results go to ``<run_uri>/eval/metrics.json``.

    :param training: the FSDPTrainingOperator result. (templated)
    :param model_name: the model whose production pointer is compared against. (templated;
        checked as a name at DAG parse, or once rendered, before launch; a pointer recording
        another model's name is refused, naming both)
    :param cluster: ``local`` or ``kubernetes``; where the evaluation job runs.
    :param image: the trainer image of the evaluation job (Kubernetes).
    :param namespace: Kubernetes namespace of the evaluation job.
    :param gpus_per_node: GPUs for the evaluation pod (one process; 0: CPU). On the local
        cluster the host must have them (checked before launch).
    :param capacity: ``on-demand`` (default: an evaluation is short, and a preempted one is
        simply failed) or ``spot``.
    :param job_options: further ``JobSpec`` fields for the cluster (see FSDPTrainingOperator).
    :param deferrable: wait in the triggerer (True) or in this worker slot (False). Default:
        ``[trainops] default_deferrable``, True when unset.
    :param poll_interval: seconds between job state polls in the triggerer, a positive number.
    :param job_timeout: seconds the evaluation may run before the task fails and deletes it
        (None: no limit, or a positive number).
    :param metrics: a team's own scorers, each ``module:function`` importable in the trainer
        image (or from its ``PYTHONPATH``), called with each scored record's prediction,
        reference and columns, overall and per slice (docs/promotion.md, "Your own metrics";
        ``examples/team_metrics.py``). The form is checked when the DAG is parsed; before launch,
        a scorer the local cluster cannot find (or one found here without its function) is
        refused, naming it; a scorer that cannot be imported, raises or returns anything but
        named numbers fails the evaluation, naming it. None: the training config's
        ``eval.metrics``.
    :param storage_root: ``file://`` or ``s3://`` root (templated; default: the embedded root).
    :param aws_conn_id: Airflow connection for ``s3://`` storage.
    :param kubernetes_conn_id: Airflow connection for ``cluster='kubernetes'``.

    Returns ``{"metrics_uri", "records_uri", "run_uri", "model_name", "candidate",
    "production", "production_version"}``; ``candidate`` and ``production`` hold the task's
    metrics (``eval_loss`` and ``perplexity``; a classifier's ``accuracy``, ``f1_macro``, ...;
    an ``sft`` model's ``exact_match`` and ``token_f1``), the team's own (``user_metrics``
    names their scorers), ``tokens`` and ``slices``; ``production`` is None on the first run.
    ``records_uri`` holds each eval record's figures, for a gate's paired bootstrap.
    """

    template_fields = ("training", "model_name", "storage_root")
    ui_color = "#d9e8f4"

    def __init__(
        self,
        *,
        training: Any,
        model_name: str,
        cluster: str = "local",
        image: str = DEFAULT_IMAGE,
        namespace: str = "default",
        gpus_per_node: int = 0,
        capacity: str = "on-demand",
        job_options: dict[str, Any] | None = None,
        deferrable: bool | None = None,
        poll_interval: float = 5.0,
        job_timeout: float | None = None,
        metrics: list[str] | None = None,
        storage_root: str | None = None,
        aws_conn_id: str | None = "aws_default",
        kubernetes_conn_id: str | None = "kubernetes_default",
        **kwargs: Any,
    ) -> None:
        super().__init__(
            cluster=cluster,
            image=image,
            namespace=namespace,
            job_options=job_options,
            deferrable=deferrable,
            poll_interval=poll_interval,
            storage_root=storage_root,
            aws_conn_id=aws_conn_id,
            kubernetes_conn_id=kubernetes_conn_id,
            **kwargs,
        )
        self.gpus_per_node, self.capacity = evaluation_job(self, gpus_per_node, capacity)
        if not known_at_run_time(model_name):
            name_param("model_name", model_name)  # else when the task runs, once rendered
        self.training, self.model_name = training, model_name
        self.job_timeout = optional_seconds("job_timeout", job_timeout, default=None)
        self.metrics = None if metrics is None else user_metric_specs(metrics)

    @fail_fast
    def execute(self, context: Any) -> Any:
        name_param("model_name", self.model_name)  # before anything is read or launched
        for key in ("run_uri", "config_uri", "export_uri"):
            if not isinstance(self.training, dict) or not self.training.get(key):
                raise ValueError(
                    f"training must be an FSDPTrainingOperator result with {key!r}, got {self.training!r}"
                )
        env = self.job_options.get("env") or {}
        check_gpus(self.cluster, nodes=1, gpus_per_node=self.gpus_per_node, env=env)
        check_scorers(self.metrics or [], self.cluster, env=env)  # before anything is launched
        root, store = root_and_storage(self.storage_root, self.aws_conn_id)
        layout = RunLayout(self.training["run_uri"])
        try:
            production = read_production(store, root, self.model_name)
        except (RegistryNameConflict, MalformedPointer) as exc:
            # A person must move a registry or mend a pointer: every retry would fail the same way.
            raise AirflowFailException(str(exc)) from exc
        overrides: dict[str, object] = {
            "eval.model_uri": self.training["export_uri"],
            "eval.output_uri": layout.eval_metrics,
        }
        if self.metrics is not None:
            overrides["eval.metrics"] = self.metrics
        if production:
            overrides["eval.baseline_uri"] = production["uri"]
            self.log.info(
                "production is %s v%s: evaluating it on the same split",
                self.model_name,
                production["version"],
            )
        else:
            self.log.info("%s has no production version yet: evaluating the candidate only", self.model_name)
        job_options = sized_job_options(self, store, layout, checkpoint=False)
        spec = one_process_job(
            "eval",
            identity=task_identity(context),
            attempt=1,
            args=trainer_argv("evaluate", self.training["config_uri"], overrides),
            labels=self.task_labels(context),
            image=self.image,
            namespace=self.namespace,
            capacity=self.capacity,
            job_options=job_options,
            storage_env=job_env_for(root, self.aws_conn_id),
            gpus_per_node=self.gpus_per_node,
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

        try:
            handle = self.backend.launch(spec)
        except JobAlreadyExists as exists:  # an earlier try's job of this task: reattach, never a second
            handle = exists.handle
            self.log.info("evaluation job %s is already there: reattaching", handle["job_id"])
        else:
            self.log.info("evaluation job %s launched", handle["job_id"])
        return self.wait_for(context, handle, timeout=self.job_timeout)

    @staticmethod
    def _request_uri(layout: RunLayout) -> str:
        return join(layout.run_uri, "eval", "request.json")

    @fail_fast
    def execute_complete(self, context: Any, event: object = None) -> dict[str, Any]:
        checked = check_event(event, expected=("finished", "timeout", "error"))
        handle, state = checked["handle"], checked.get("state")
        if checked["status"] == "error":  # watching failed, not the job: leave it running
            raise RuntimeError(waiting_failed(checked, 1, what="evaluation job"))
        if checked["status"] != "finished" or state is None or state["phase"] != "succeeded":
            tail = self.backend.logs_tail(handle, lines=20)
            if checked["status"] != "finished":
                self.backend.delete(handle)
            else:
                self.clean_up(handle, "fail")
            seen = (state.get("reason") or state["phase"]) if state else checked["status"]
            raise RuntimeError(
                f"evaluation job {handle['job_id']} did not succeed "
                f"({checked.get('message') or seen}).\nLast log lines:\n{tail}"
            )
        self.clean_up(handle, "finish")  # it wrote its metrics; reading them needs no pod
        _, store = root_and_storage(self.storage_root, self.aws_conn_id)
        layout = RunLayout(self.training["run_uri"])
        metrics = get_json_object(store, layout.eval_metrics)
        production_version = get_json_object(store, self._request_uri(layout))["production_version"]
        result = {
            "metrics_uri": layout.eval_metrics,
            "records_uri": metrics.get("records_uri"),  # each record's figures, for a paired gate
            "run_uri": layout.run_uri,
            "model_name": self.model_name,
            "candidate": metrics["candidate"],
            "production": metrics.get("baseline"),
            "production_version": production_version,
        }
        self.log.info(_scores_line(result["candidate"], result["production"], production_version))
        return result


def evaluation_job(op: ClusterJobOperator, gpus_per_node: object, capacity: str) -> tuple[int, str]:
    """``(gpus_per_node, capacity)`` of an evaluation job of ``op`` (one process, never
    relaunched), checked when the DAG is parsed: the job must render for the cluster."""
    if capacity not in EVALUATION_CAPACITIES:
        raise ValueError(
            f"capacity {capacity!r}: an evaluation runs on {' or '.join(repr(c) for c in EVALUATION_CAPACITIES)}"
        )
    gpus = as_int("gpus_per_node", gpus_per_node, minimum=0)
    check_renders(
        op.cluster,
        distributed=False,
        gpus_per_node=gpus,
        image=op.image,
        namespace=op.namespace,
        capacity=capacity,
        **op.job_options,
    )
    return gpus, capacity


def sized_job_options(op: Any, store: Storage, layout: RunLayout, *, checkpoint: bool) -> dict[str, Any]:
    """``op``'s ``job_options`` over the evaluation pod's size for the run's model
    (:mod:`trainops.operators.eval_sizing`; said in the log on Kubernetes, where it counts)."""
    try:
        config = run_config(store, layout)
        manifest = dataset_manifest(storage_for(config.data_uri, op.aws_conn_id), config.data_uri)
    except (NotFound, ValueError) as exc:  # the job will say so; the pod keeps job_options' size
        op.log.warning("could not size the evaluation pod from the run's config and dataset: %s", exc)
        return dict(op.job_options)
    pod = eval_pod(model_params(config, manifest), gpus=op.gpus_per_node, checkpoint=checkpoint)
    if pod is None:
        return dict(op.job_options)
    if op.cluster == "kubernetes":
        op.log.info("%s (job_options memory, cache_size, ephemeral_storage override it)", pod.describe())
    return {**pod.options(), **op.job_options}


def user_metric_specs(metrics: object) -> list[str]:
    """``metrics`` as the trainer's ``eval.metrics``, or a ValueError naming the value at fault."""
    if isinstance(metrics, str) or not isinstance(metrics, (list, tuple)):
        raise ValueError(
            f"metrics must be a list of 'module:function' strings, e.g. ['team_metrics:score'], got {metrics!r}"
        )
    try:
        return check_user_metrics(metrics)
    except ConfigError as exc:
        raise ValueError(f"metrics: {exc}") from None


def _scores_line(candidate: dict[str, Any], production: dict[str, Any] | None, version: int | None) -> str:
    """The task's own metrics (and a team's) for the log: candidate, then production."""
    names = [m.name for m in shown_metrics(candidate, production)]

    def scores(metrics: dict[str, Any]) -> str:
        return ", ".join(f"{n} {metrics[n]:.4g}" for n in names if isinstance(metrics.get(n), (int, float)))

    line = f"candidate {scores(candidate)}"
    return line + (f"; production v{version} {scores(production)}" if production else "")
