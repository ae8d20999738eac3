"""EvaluateCheckpointsOperator: score a run's checkpoints while it trains, and pick the best.

It runs beside the training task (both downstream of staging), as a sensor in ``reschedule``
mode: each time it wakes it looks at the run in storage (:mod:`trainops.operators.checkpoint_plan`
decides), launches at most one evaluation job, and gives its worker slot back. Each job exports
one checkpoint and scores that export (``trainer evaluate`` with ``eval.export_uri``): one
process, CPU or one GPU, on-demand, never part of the gang, which it never slows or stalls.

Which checkpoints: every ``eval.every_checkpoints``-th regular one of the run's trainer config
(steps that are multiples of ``eval.every_checkpoints * checkpoint.every_steps``), and the
run's last. The trainer keeps each until its score is written, whatever ``checkpoint.keep``
says. Once training succeeded and every one is scored, the best by ``best_by``
(:func:`trainops.gate.best.pick_best`) becomes the candidate: the task returns the training
task's result with ``export_uri`` set to that checkpoint's export and ``checkpoint_pick``
saying which step and why, so the evaluation, the gate and the promotion take it instead of
the last one, and the model card names its step.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow.sdk.bases.sensor import BaseSensorOperator, PokeReturnValue
from airflow.sdk.exceptions import AirflowFailException

from trainer.contract import (
    RunLayout,
    checkpoint_step_of,
    join,
    prune_plan,
    run_prefix,
    scheduled_for_eval,
    trainer_argv,
)
from trainer.storage import NotFound, Storage, StorageUnavailable
from trainops.cluster.base import FINAL_PHASES, JobAlreadyExists
from trainops.gate.best import CheckpointScore, Pick, pick_best
from trainops.gate.metrics import check_direction
from trainops.hooks.storage import get_json_object, job_env_for, root_and_storage
from trainops.operators.base import DEFAULT_IMAGE, ClusterJobOperator, TaskIdentity, task_identity
from trainops.operators.checkpoint_plan import SUCCEEDED, RunView, next_move
from trainops.operators.evaluate import evaluation_job, sized_job_options, user_metric_specs
from trainops.operators.fail_fast import fail_fast
from trainops.operators.launch_plan import one_process_job
from trainops.operators.params import as_int
from trainops.operators.preflight import check_gpus, check_scorers
from trainops.operators.train_launch import run_config
from trainops.operators.train_record import read_job

# Finished evaluation jobs read in one look before the slot is given back.
MAX_SCORED_PER_LOOK = 8
STEP_LABEL = "trainops/checkpoint-step"


class EvaluateCheckpointsOperator(ClusterJobOperator, BaseSensorOperator):
    """Score every Nth checkpoint of a training run while it trains; pick the best by a metric.

    Put it beside the training task, downstream of the same staging task, and give its result
    to ``EvaluateModelOperator`` and ``PromoteModelOperator`` as their ``training``: they then
    evaluate, gate and promote the picked checkpoint's export instead of the last one. The
    training's trainer config must set ``eval.every_checkpoints`` (docs/promotion.md, "The best
    checkpoint").

    :param training_task_id: the ``FSDPTrainingOperator`` task of the same DAG run whose run is
        scored (its run folder is found from the DAG run, as the training task finds it).
    :param best_by: the metric that picks the checkpoint (default ``eval_loss``): a built-in one
        (its own direction) or a team's own, from ``metrics``, with ``direction``.
    :param direction: ``higher_is_better`` or ``lower_is_better``; a team's own metric needs it.
    :param metrics: a team's own scorers (``module:function``), as ``EvaluateModelOperator``
        takes them; None: the training config's ``eval.metrics``.
    :param max_batches: eval batches per checkpoint (None: the config's ``eval.max_batches``;
        0: the whole split). Fewer make each score cheaper and noisier.
    :param poll_interval: seconds between looks at the run (the sensor's ``poke_interval``).
    :param timeout: seconds the task may wait in all, training included (the sensor's; default
        7 days), after which it fails. A storage outage that outlasts the storage client's
        tolerance (``[trainops] storage_outage_tolerance``) only makes it look again later.
    :param cluster: ``local`` or ``kubernetes``; where the evaluation jobs run.
    :param image: the trainer image of the evaluation jobs (Kubernetes).
    :param namespace: Kubernetes namespace of the evaluation jobs.
    :param gpus_per_node: GPUs of each evaluation job (one process; 0: CPU).
    :param capacity: ``on-demand`` (default) or ``spot``: each job is short and never relaunched.
    :param job_options: further ``JobSpec`` fields for the cluster (see FSDPTrainingOperator).
    :param storage_root: ``file://`` or ``s3://`` root (templated; default: the embedded root).
    :param aws_conn_id: Airflow connection for ``s3://`` storage.
    :param kubernetes_conn_id: Airflow connection for ``cluster='kubernetes'``.

    Returns the training task's result with ``export_uri`` (the picked checkpoint's export) and
    ``checkpoint_pick``: ``step``, ``metric``, ``direction``, ``value``, ``last_step``, ``why``
    and ``checkpoints`` (each scored step's figure, or why it was skipped). The pick is also
    stored at ``<run_uri>/eval/checkpoint_pick.json``; each score at
    ``<run_uri>/eval/checkpoints/step_<N>.json``.
    """

    template_fields = ("storage_root",)
    ui_color = "#d9e8f4"

    def __init__(
        self,
        *,
        training_task_id: str = "train",
        best_by: str = "eval_loss",
        direction: str | None = None,
        metrics: list[str] | None = None,
        max_batches: int | None = None,
        cluster: str = "local",
        image: str = DEFAULT_IMAGE,
        namespace: str = "default",
        gpus_per_node: int = 0,
        capacity: str = "on-demand",
        job_options: dict[str, Any] | None = None,
        poll_interval: float = 30.0,
        timeout: float = 7 * 24 * 3600.0,
        storage_root: str | None = None,
        aws_conn_id: str | None = "aws_default",
        kubernetes_conn_id: str | None = "kubernetes_default",
        **kwargs: Any,
    ) -> None:
        for own in ("poke_interval", "mode", "deferrable"):
            if own in kwargs:
                raise ValueError(
                    f"{own}: this operator always waits in reschedule mode, a look every poll_interval "
                    "seconds; set poll_interval (and timeout) instead"
                )
        super().__init__(
            cluster=cluster,
            image=image,
            namespace=namespace,
            job_options=job_options,
            deferrable=False,
            poll_interval=poll_interval,
            storage_root=storage_root,
            aws_conn_id=aws_conn_id,
            kubernetes_conn_id=kubernetes_conn_id,
            poke_interval=poll_interval,
            timeout=timeout,
            mode="reschedule",
            **kwargs,
        )
        if not isinstance(training_task_id, str) or not training_task_id:
            raise ValueError(f"training_task_id must name the training task, got {training_task_id!r}")
        self.training_task_id = training_task_id
        self.best_by, self.direction = best_by, check_direction("best_by", best_by, direction)
        self.metrics = None if metrics is None else user_metric_specs(metrics)
        self.max_batches = None if max_batches is None else as_int("max_batches", max_batches, minimum=0)
        self.gpus_per_node, self.capacity = evaluation_job(self, gpus_per_node, capacity)

    @fail_fast
    def execute(self, context: Any) -> Any:
        env = self.job_options.get("env") or {}
        check_gpus(self.cluster, nodes=1, gpus_per_node=self.gpus_per_node, env=env)
        check_scorers(self.metrics or [], self.cluster, env=env)  # before anything is launched
        return super().execute(context)

    # -- one look ----------------------------------------------------------------------
    def poke(self, context: Any) -> PokeReturnValue | bool:
        try:
            return self._look(context)
        except StorageUnavailable as exc:  # an outage outlasting the client's tolerance: not ours
            self.log.warning(
                "storage is unavailable (%s); nothing was launched or lost: looking again in %ss",
                exc,
                self.poke_interval,
            )
            return False

    def _look(self, context: Any) -> PokeReturnValue | bool:
        """One look at the run (see the module docstring)."""
        identity = task_identity(context)
        trained: TaskIdentity = {**identity, "task_id": self.training_task_id}
        root, store = root_and_storage(self.storage_root, self.aws_conn_id)
        layout = RunLayout(
            run_prefix(
                root, identity["dag_id"], identity["run_id"], self.training_task_id, identity["map_index"]
            )
        )
        for _ in range(MAX_SCORED_PER_LOOK):
            flight = _in_flight(store, layout)
            if flight is not None:  # the job launched by an earlier look: done yet?
                if not self._watch(store, layout, flight):
                    return False
                continue
            move = next_move(self._view(store, layout, trained, _task_state(context, trained)))
            if move.kind == "fail":
                raise AirflowFailException(f"{layout.run_uri}: {move.why}")
            if move.kind == "wait":
                self.log.info("%s; looking again in %ss", move.why, self.poke_interval)
                return False
            if move.kind == "pick":
                return self._pick(context, store, layout)
            assert move.step is not None
            self._launch(context, store, layout, move.step, root)
            return False
        return False

    def _view(
        self, store: Storage, layout: RunLayout, trained: TaskIdentity, task_state: str | None
    ) -> RunView:
        """The run as storage shows it now (:class:`RunView`)."""
        job = read_job(store, layout, trained)  # another run's folder: RunFolderTaken
        if job is None:
            return RunView(0, 0, frozenset(), frozenset(), None, task_state=task_state)
        config = run_config(store, layout)
        if config.eval.every_checkpoints < 1:
            raise AirflowFailException(
                f"{layout.config} has eval.every_checkpoints {config.eval.every_checkpoints}: set it in the "
                f"trainer_config of {self.training_task_id!r} (e.g. 1: score every checkpoint), or drop this task"
            )
        if config.resume != "auto":
            # A try that starts over re-commits every step with other weights, under the names
            # of scores already written: they would stand for weights that are gone.
            raise AirflowFailException(
                f"{layout.config} has resume {config.resume!r}: mid-run evaluation needs resume 'auto', "
                "where a step committed again (by a resumed attempt) holds the same weights; drop resume "
                f"from the trainer_config of {self.training_task_id!r}, or drop this task"
            )
        status = job["status"]
        try:
            latest = int(get_json_object(store, layout.latest).get("step", 0))
        except NotFound:  # nothing committed yet
            latest = 0
        return RunView(
            every_steps=config.checkpoint.every_steps,
            every_checkpoints=config.eval.every_checkpoints,
            committed=committed_steps(store.list(layout.checkpoints)),
            scored=scored_steps(store.list(layout.checkpoint_scores), layout),
            status=status,
            final_step=latest if status == SUCCEEDED else None,
            latest_step=latest,
            task_state=task_state,
        )

    def _launch(self, context: Any, store: Storage, layout: RunLayout, step: int, root: str) -> None:
        """Launch checkpoint ``step``'s evaluation job and note it as the one in flight."""
        overrides: dict[str, object] = {
            "eval.model_uri": layout.checkpoint(step),
            "eval.export_uri": layout.checkpoint_export(step),
            "eval.output_uri": layout.checkpoint_score(step),
            "eval.baseline_uri": "",
        }
        if self.metrics is not None:
            overrides["eval.metrics"] = self.metrics
        if self.max_batches is not None:
            overrides["eval.max_batches"] = self.max_batches
        spec = one_process_job(
            f"ckpt{step}",
            identity=task_identity(context),
            # this task's try: a retry's job is a new one, never the failed one still going away
            attempt=max(1, int(getattr(context["ti"], "try_number", 1) or 1)),
            args=trainer_argv("evaluate", layout.config, overrides),
            labels={**self.task_labels(context), STEP_LABEL: str(step)},
            image=self.image,
            namespace=self.namespace,
            capacity=self.capacity,
            job_options=sized_job_options(self, store, layout, checkpoint=True),
            storage_env=job_env_for(root, self.aws_conn_id),
            gpus_per_node=self.gpus_per_node,
        )
        try:
            handle = self.backend.launch(spec)
        except JobAlreadyExists as exists:  # an earlier look launched it, and its note was lost
            handle = exists.handle
            self.log.info("checkpoint step %d: evaluation job %s is already there", step, handle["job_id"])
        else:
            self.log.info("checkpoint step %d: evaluation job %s launched", step, handle["job_id"])
        store.put_json(_in_flight_uri(layout), {"step": step, "handle": handle})

    def _watch(self, store: Storage, layout: RunLayout, flight: Mapping[str, Any]) -> bool:
        """The job in flight: False while it runs; once it ended, deleted and its note too (True),
        its score read, or why it was skipped written; a failure to score raises, with its log."""
        step, handle = int(flight["step"]), flight["handle"]
        state = self.backend.status(handle)
        if state["phase"] not in FINAL_PHASES:
            self.log.info(
                "checkpoint step %d: evaluation job %s is %s", step, handle["job_id"], state["phase"]
            )
            return False
        # Its score decides, not the phase: a look that died between deleting the job and its
        # note finds the job gone ("lost") with the score written.
        succeeded = store.head(layout.checkpoint_score(step)) is not None
        tail = "" if succeeded else self.backend.logs_tail(handle, lines=20)
        self.clean_up(handle, "finish" if succeeded else "fail")
        store.delete(_in_flight_uri(layout))  # from here on, a retry launches it afresh
        if succeeded:
            scores = get_json_object(store, layout.checkpoint_score(step))
            self.log.info(
                "checkpoint step %d: %s", step, _figures(scores.get("candidate") or {}, self.best_by)
            )
            return True
        if store.head(layout.committed_marker(step)) is None:  # deleted under the job: nothing to score
            why = f"its checkpoint was deleted before it could be scored (job {handle['job_id']})"
            store.put_json(layout.checkpoint_score(step), {"skipped": why})
            self.log.warning("checkpoint step %d skipped: %s", step, why)
            return True
        raise RuntimeError(
            f"the evaluation of checkpoint step {step} (job {handle['job_id']}) did not succeed "
            f"({state.get('reason') or state['phase']}).\nLast log lines:\n{tail}"
        )

    def _prune_scored(self, store: Storage, layout: RunLayout) -> None:
        """Delete the checkpoints the trainer kept only for their scores, now written: those
        its own rule (``checkpoint.keep`` newest) would have pruned. Training is over."""
        config = run_config(store, layout)
        committed = committed_steps(store.list(layout.checkpoints))
        newest = max(committed, default=0)
        due = {
            s
            for s in committed
            if scheduled_for_eval(s, config.checkpoint.every_steps, config.eval.every_checkpoints)
        }
        for step in prune_plan(sorted(committed), set(committed), config.checkpoint.keep, newest):
            if step in due:
                store.delete_prefix(layout.checkpoint(step))
                self.log.info(
                    "checkpoint step %d pruned: scored, and not among the newest %d",
                    step,
                    config.checkpoint.keep,
                )

    def _pick(self, context: Any, store: Storage, layout: RunLayout) -> PokeReturnValue | bool:
        """Every due checkpoint is scored and training succeeded: the best one, as the candidate."""
        scores = read_scores(store, layout)
        pick = pick_best(scores, self.best_by, self.direction)
        store.put_json(layout.checkpoint_pick, pick.document())
        self.log.info("picked: %s", pick.why)
        drop_other_exports(store, layout, pick, [s.step for s in scores])
        self._prune_scored(store, layout)
        index = task_identity(context)["map_index"]
        training = context["ti"].xcom_pull(
            task_ids=self.training_task_id,
            key="return_value",
            **({"map_indexes": index} if index >= 0 else {}),
        )
        if not isinstance(training, Mapping) or training.get("run_uri") != layout.run_uri:
            self.log.info("waiting for %r's result to be published", self.training_task_id)
            return False
        return PokeReturnValue(
            is_done=True,
            xcom_value={**training, "export_uri": pick.export_uri, "checkpoint_pick": pick.document()},
        )


def _task_state(context: Any, trained: TaskIdentity) -> str | None:
    """The training task instance's Airflow state (None: Airflow could not say)."""
    ti = context["ti"]
    getter = getattr(ti, "get_task_states", None)
    if getter is None:
        return None
    index = trained["map_index"]
    try:
        states = getter(
            dag_id=trained["dag_id"],
            task_ids=[trained["task_id"]],
            run_ids=[trained["run_id"]],
            **({"map_index": index} if index >= 0 else {}),
        )
    except Exception:  # a question, never a reason to fail a look
        return None
    state = (
        (states.get(trained["run_id"]) or {}).get(trained["task_id"]) if isinstance(states, Mapping) else None
    )
    return None if state is None else str(state)


def _in_flight_uri(layout: RunLayout) -> str:
    return join(layout.checkpoint_scores, "in_flight.json")


def _in_flight(store: Storage, layout: RunLayout) -> dict[str, Any] | None:
    """The evaluation job an earlier look launched and has not seen end (None: none)."""
    try:
        return get_json_object(store, _in_flight_uri(layout))
    except NotFound:
        return None


def committed_steps(listed: list[str]) -> frozenset[int]:
    """The steps whose checkpoint folder holds a ``_COMMITTED`` marker, from a listing of
    ``<run>/checkpoints`` (the evaluation job checks each one's files and fence itself)."""
    return frozenset(
        step
        for uri in listed
        if uri.endswith("/_COMMITTED") and (step := checkpoint_step_of(uri.rsplit("/", 1)[0])) is not None
    )


def scored_steps(listed: list[str], layout: RunLayout) -> frozenset[int]:
    """The steps with a score (or a skip) written, from a listing of ``<run>/eval/checkpoints``
    (by the objects' names, so a root spelt another way lists the same steps)."""
    return frozenset(
        step
        for uri in listed
        if uri.endswith(".json") and (step := checkpoint_step_of(uri[: -len(".json")])) is not None
        if uri.rsplit("/", 2)[-2:] == layout.checkpoint_score(step).rsplit("/", 2)[-2:]
    )


def read_scores(store: Storage, layout: RunLayout) -> list[CheckpointScore]:
    """Every written checkpoint score (or skip), oldest first."""
    out = []
    for step in sorted(scored_steps(store.list(layout.checkpoint_scores), layout)):
        doc = get_json_object(store, layout.checkpoint_score(step))
        if "skipped" in doc:
            out.append(CheckpointScore(step, None, None, skipped=str(doc["skipped"])))
            continue
        candidate = doc.get("candidate") or {}
        export = layout.checkpoint_export(step)  # where this task's job wrote it, never a path read back
        exported = (
            candidate.get("model_uri") == export and store.head(join(export, "export.json")) is not None
        )
        out.append(CheckpointScore(step, candidate, export if exported else None))
    return out


def drop_other_exports(store: Storage, layout: RunLayout, pick: Pick, steps: list[int]) -> None:
    """Delete the exports of the checkpoints not picked (their scores stay): only the pick's
    can be promoted, and each is a copy of the model's weights."""
    for step in steps:
        if step != pick.step:
            store.delete_prefix(layout.checkpoint_export(step))


def _figures(scores: Mapping[str, Any], first: str) -> str:
    """``best_by``'s figure first, then eval_loss, for the log."""
    names = dict.fromkeys([first, "eval_loss"])
    return ", ".join(
        f"{n} {v:.4g}"
        for n in names
        if isinstance(v := scores.get(n, (scores.get("user_metrics") or {}).get(n)), (int, float))
    )
