"""FSDPTrainingOperator: run the FSDP trainer on a cluster and carry it through preemptions.

The operator does the Airflow work (context, backend calls, deferrals, errors, XCom); what
happens after each event is :func:`trainops.recovery.driver.step`'s to decide."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from trainer.config import dump_yaml
from trainer.contract import RunLayout, run_prefix
from trainer.storage import Storage
from trainops.cost.bill import with_bill
from trainops.cost.prices import load_prices
from trainops.hooks.storage import root_and_storage
from trainops.links import RUN_REPORT_KEY, RunReportLink
from trainops.operators import params, train_launch, train_reads, train_record, train_settings
from trainops.operators.base import DEFAULT_IMAGE, ClusterJobOperator, TaskIdentity, now_iso, task_identity
from trainops.operators.deadlines import waiting_failed
from trainops.operators.fail_fast import fail_fast
from trainops.operators.launch_plan import LaunchSettings, checked_run_config, manifests_of
from trainops.operators.train_record import OperatorCall as _Call
from trainops.recovery import driver
from trainops.recovery.notice import grace_warning
from trainops.triggers.events import check_event
from trainops.triggers.job import JobGoneTrigger

if TYPE_CHECKING:
    from trainops.cluster.base import JobHandle
    from trainops.operators.launch_plan import AttemptLaunch
    from trainops.recovery.record import Budgets, JobRecord


class FSDPTrainingOperator(ClusterJobOperator):
    """Train with the trainops FSDP trainer (torchrun) and relaunch it after every preemption.

    The operator writes the resolved ``config.yaml`` under the run prefix
    ``<storage_root>/runs/<dag_id>/<run_id>/<task_id>``, launches ``nodes`` x ``gpus_per_node``
    workers on ``cluster`` and defers while they run. When an attempt ends it reads the
    trainer's attempt record and the cluster's view, classifies the attempt (succeeded,
    preempted, infra, error) and either finishes, relaunches (the trainer resumes from the last
    committed checkpoint under the same prefix) or fails with the trainer's hint and log tail.
    Every attempt is recorded in ``job.json``. Preemptions have their own budget
    (``max_preemptions``), separate from Airflow's ``retries``.

    Every input is checked before anything is launched or written: plain values when the DAG
    is parsed, templated ones once rendered; in ``execute``, before ``config.yaml`` is written,
    the dataset's manifest (it must be a staged version whose train split can feed
    ``train.seq_len`` and whose tokenizer fits ``model.vocab_size``), the ``model.builder``
    where this host can see it, and, on the local cluster, this host's GPUs
    (docs/operators.md, "Bad inputs").

    :param dataset: the StageDatasetOperator result (its ``uri`` is the trainer's ``data_uri``)
        or a dataset version URI (``file:///abs/...`` or ``s3://bucket/...``). (templated)
    :param trainer_config: trainer settings, nested (``{"train": {"lr": 1e-3}}``) or dotted
        (``{"train.lr": 1e-3}``); see ``python -m trainer train --help``. ``init.from``
        ``production``/``auto`` is resolved here, before launch (docs/trainer.md, "Warm start"). (templated)
    :param model_name: the registry model whose production version ``init.from: production``
        (or ``auto``) starts from; None: those values are refused. Checked as a name at DAG parse
        (so a bad one fails before training, not at promotion).
    :param nodes: number of nodes; each runs one torchrun agent. (templated)
    :param gpus_per_node: GPUs per node; 0 runs one CPU process per node (gloo). (templated)
    :param cluster: ``local`` (this host; the embedded default) or ``kubernetes``.
    :param capacity: ``spot``, ``on-demand`` or ``spot-then-on-demand``. (templated)
    :param max_preemptions: relaunches allowed after preemptions before the task fails.
        (templated; a templated sizing setting is checked when the task runs, a plain one when
        the DAG is parsed)
    :param max_infra_retries: relaunches allowed after infrastructure failures (image pull,
        no node found), each after a back-off of 30 s doubling up to 10 min; an integer >= 0.
    :param restarts_in_place: how often torchrun restarts a node's worker processes in the same
        pod after one of them died or raised (its ``--max-restarts``), an integer from 0 to 10:
        the gang re-forms and resumes from the newest checkpoint, read from the node-local tier
        where the node holds it, without new pods. Once they are spent, torchrun exits and the
        whole gang is relaunched, as every failure is with 0, which turns them off. (templated)
    :param fallback_after: with ``spot-then-on-demand``, preemptions before moving to on-demand
        (None, or an integer >= 1).
        The move also happens when spot pods stay unschedulable past ``unschedulable_timeout``.
    :param unschedulable_timeout: seconds (Kubernetes, positive) pods may wait for a node before the
        attempt ends as an infrastructure failure, or, with ``spot-then-on-demand``, before
        the job moves to on-demand. A job that Kueue holds suspended is queued, not waiting.
    :param termination_grace_seconds: SIGTERM-to-SIGKILL seconds, an integer >= 1: the emergency
        checkpoint's budget.
    :param image: the trainer image (Kubernetes).
    :param namespace: Kubernetes namespace of the jobs.
    :param job_options: further ``JobSpec`` fields for the cluster, checked when the DAG is
        parsed: ``kind``, ``scheduler``, ``spot_flavour``, ``cpu``, ``memory``, ``shm_size``,
        ``env``, ``env_from_secrets``, ``service_account``, ``labels``, ``annotations``,
        ``node_selector``, ``tolerations``, ``affinity``, ``priority_class``, ``nccl_env``,
        ``cluster_domain``, ``runtime``, ``cache_size`` and ``ephemeral_storage`` (the pods'
        disk, estimated from the model and the dataset when not set),
        ``ttl_seconds_after_finished`` (see docs/kubernetes.md), on every cluster.
    :param deferrable: wait in the triggerer (True) or in this worker slot (False). Default:
        ``[trainops] default_deferrable``, True when unset.
    :param inject_preemption: local cluster only, for demos and tests: ``{"node": 1, "at_step":
        40}`` SIGTERMs that node's torchrun once attempt 1 reaches the step. (templated)
    :param poll_interval: seconds between job state polls in the triggerer, a positive number.
    :param progress_every: seconds between progress lines (step, loss, tokens/s) in the task
        log, a positive number.
    :param job_timeout: seconds an attempt may run before the task fails and deletes it (None:
        no limit, or a positive number).
    :param keep_finished_jobs: keep a finished attempt's job, Service and PodGroup (Kubernetes:
        for a day, ``ttlSecondsAfterFinished``, where the kind has one; ``job_options``
        ``ttl_seconds_after_finished`` sets another). Default False: they are deleted once
        job.json records the attempt, its log tail included.
    :param hang_timeout: seconds without a new training step after which a running attempt
        is hung: its logs tail is kept in job.json, the whole gang is deleted and relaunched
        against ``max_infra_retries``. None (the default) derives it from the attempt's median
        step time, ``max(600, 20 x median)``; the first step gets 30 minutes more (compile,
        warm-up). A positive number otherwise.
    :param prices: the price table for the run's cost estimate, laid over the Variable
        ``trainops_prices`` and the shipped table (docs/cost.md): a mapping, or its JSON text,
        of instance type -> ``spot`` / ``on-demand`` -> ``{"per_hour": USD, "gpus": N}``
        (``"*"``: USD per GPU-hour of an instance type no table knows). Checked before anything
        is launched. (templated)
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
        "restarts_in_place",
        "prices",
        "inject_preemption",
    )
    ui_color = "#f4d9c6"
    operator_extra_links = (RunReportLink(),)
    handles_deadline = True  # execute_complete records the attempt; relaunch_when_gone fails

    def __init__(
        self,
        *,
        dataset: Any,
        trainer_config: dict[str, Any] | None = None,
        model_name: str | None = None,
        nodes: int = 1,
        gpus_per_node: int = 0,
        cluster: str = "local",
        capacity: str = "spot",
        max_preemptions: int = 3,
        max_infra_retries: int = 2,
        restarts_in_place: int = 2,
        fallback_after: int | None = None,
        unschedulable_timeout: float = 900,
        image: str = DEFAULT_IMAGE,
        namespace: str = "default",
        termination_grace_seconds: int = 60,
        job_options: dict[str, Any] | None = None,
        deferrable: bool | None = None,
        inject_preemption: dict[str, Any] | str | None = None,
        poll_interval: float = 5.0,
        progress_every: float = 30.0,
        job_timeout: float | None = None,
        keep_finished_jobs: bool = False,
        hang_timeout: float | None = None,
        prices: dict[str, Any] | str | None = None,
        storage_root: str | None = None,
        aws_conn_id: str | None = "aws_default",
        kubernetes_conn_id: str | None = "kubernetes_default",
        **kwargs: Any,
    ) -> None:
        if inject_preemption is not None and cluster != "local":
            raise ValueError("inject_preemption works only with cluster='local' (a demo and test aid)")
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
        self.dataset = dataset
        if model_name is not None:  # not templated: checked at DAG parse, not after training
            params.name_param("model_name", model_name)
        self.trainer_config, self.model_name = trainer_config or {}, model_name
        self.nodes, self.gpus_per_node = nodes, gpus_per_node
        self.capacity, self.max_preemptions = capacity, max_preemptions
        self.max_infra_retries = params.as_int("max_infra_retries", max_infra_retries, minimum=0)
        self.restarts_in_place = restarts_in_place
        self.fallback_after = params.optional_int("fallback_after", fallback_after, minimum=1)
        self.termination_grace_seconds = params.as_int(
            "termination_grace_seconds", termination_grace_seconds, minimum=1
        )
        self.inject_preemption = inject_preemption
        if not isinstance(keep_finished_jobs, bool):
            raise ValueError(f"keep_finished_jobs must be True or False, got {keep_finished_jobs!r}")
        self.keep_finished_jobs = keep_finished_jobs
        self.progress_every = params.seconds("progress_every", progress_every, default=30.0)
        self.job_timeout = params.optional_seconds("job_timeout", job_timeout, default=None)
        self.hang_timeout = params.optional_seconds("hang_timeout", hang_timeout, default=None)
        self.unschedulable_timeout = params.optional_seconds(
            "unschedulable_timeout", unschedulable_timeout, default=900
        )
        self.prices = prices
        # Plain values are checked now, at DAG parse; templated ones once rendered, in execute.
        if not params.known_at_run_time(prices):
            load_prices(prices, None)  # read as a price table: ValueError naming a bad entry
        if not params.known_at_run_time(dataset):
            params.dataset_uri(dataset)
        sizing = (nodes, gpus_per_node, capacity, max_preemptions, restarts_in_place)
        sizing_known = not any(params.known_at_run_time(v) for v in sizing)
        if sizing_known:
            self._check_settings()
        if not params.known_at_run_time(self.trainer_config):  # the trainer's schema, with stand-ins
            stand_in = "file:///dataset" if params.known_at_run_time(dataset) else params.dataset_uri(dataset)
            world_size = self.launch_settings().world_size if sizing_known else None  # None: templated
            checked_run_config(
                self.trainer_config, run_uri="file:///run", data_uri=stand_in, world_size=world_size
            )

    def _check_settings(self) -> None:
        """Check (and, from rendered templates, convert) the sizing settings; on Kubernetes,
        render a trial JobSpec too. At DAG parse for plain values, else when the task runs."""
        self.restarts_in_place = train_settings.checked_restarts(self.restarts_in_place)
        self.nodes, self.gpus_per_node, self.max_preemptions = train_settings.checked_sizing(
            self.cluster,
            nodes=self.nodes,
            gpus_per_node=self.gpus_per_node,
            max_preemptions=self.max_preemptions,
            capacity=self.capacity,
            job_options=self.job_options,
            image=self.image,
            namespace=self.namespace,
            termination_grace_seconds=self.termination_grace_seconds,
        )

    def cluster_options(self) -> dict[str, Any]:
        options = super().cluster_options()
        if self.cluster == "kubernetes" and self.unschedulable_timeout is not None:
            options["unschedulable_deadline_s"] = self.unschedulable_timeout
        return options

    def launch_settings(self) -> LaunchSettings:
        """What every attempt's job is made of (once :meth:`_check_settings` has run); the pods'
        disk is sized per attempt (:func:`~trainops.operators.train_launch.attempt_launch`)."""
        return LaunchSettings(
            keep_finished_jobs=self.keep_finished_jobs,
            nodes=self.nodes,
            gpus_per_node=self.gpus_per_node,
            image=self.image,
            namespace=self.namespace,
            termination_grace_seconds=self.termination_grace_seconds,
            job_options=self.job_options,
            inject_preemption=self.inject_preemption,
            restarts_in_place=self.restarts_in_place,
        )

    def _run(self, context: Mapping[str, Any]) -> tuple[Storage, RunLayout, TaskIdentity]:
        """The storage client, the run's layout and the task's identity."""
        identity = task_identity(context)
        root, store = root_and_storage(self.storage_root, self.aws_conn_id)
        run_uri = run_prefix(
            root, identity["dag_id"], identity["run_id"], identity["task_id"], identity["map_index"]
        )
        return store, RunLayout(run_uri), identity

    def report_uri(self, context: Mapping[str, Any]) -> str | None:
        """The run's ``job.json``: the "Training report" the task log names at its start."""
        return self._run(context)[1].job

    # -- execute -----------------------------------------------------------------------
    @fail_fast
    def execute(self, context: Any) -> Any:
        # Every input is checked before anything is written or launched.
        self._check_settings()
        load_prices(self.prices, None)
        store, layout, identity = self._run(context)
        config = train_launch.checked_config(
            self.trainer_config,
            self.launch_settings(),
            cluster=self.cluster,
            data_uri=params.dataset_uri(self.dataset),
            layout=layout,
            store=store,
            model_name=self.model_name,
            storage_root=self.storage_root,
            aws_conn_id=self.aws_conn_id,
        )
        job = train_record.claim(  # before config.yaml: it may be another run's
            store,
            layout,
            identity,
            cluster=self.cluster,
            capacity=self.capacity,
            read=lambda: self._read_job(store, layout, identity),
        )
        store.put(layout.config, dump_yaml(config).encode())
        self.log.info("trainer config written to %s", layout.config)
        if callable(getattr(context.get("ti"), "xcom_push", None)):  # the "Training report" link,
            context["ti"].xcom_push(key=RUN_REPORT_KEY, value=layout.job)  # on a reattach too
        return self._step(_Call(context, store, layout, identity), job, driver.TryStarted())

    def _step(self, run: _Call, job: JobRecord | None, event: driver.Event) -> Any:
        """The recovery driver decides what ``event`` means for ``job``; carry it out (its Step)."""
        budgets: Budgets = {  # the recovery budgets, separate from Airflow's retries
            "max_preemptions": self.max_preemptions,
            "max_infra_retries": self.max_infra_retries,
            "fallback_after": self.fallback_after,
        }
        outcome = driver.step(job, event, driver.Settings(run.layout.job, budgets, self.capacity, now_iso()))
        if outcome.delete_first is not None:
            self.backend.delete(outcome.delete_first)
        job = outcome.job
        if job is not None and outcome.bill:  # the run is over: its bill goes with it
            job = with_bill(job, run.store, run.layout.run_uri, self.prices, self.log)
        if job is not None and outcome.write:
            run.store.put_json(run.layout.job, job)
        for note in outcome.notes:
            (self.log.warning if note.level == "warning" else self.log.info)("%s", note.text)
        if job is not None and isinstance(event, driver.WaitEnded) and event.event["status"] == "finished":
            warning = grace_warning(self.termination_grace_seconds, job["attempts"])
            if warning:
                self.log.warning("%s", warning)
        return self._act(run, job, outcome.action)

    def _act(self, run: _Call, job: JobRecord | None, action: driver.Action) -> Any:
        """Do what the driver said: look, wait, launch, relaunch, return the result, or fail."""
        if isinstance(action, driver.Fail):
            message = action.message
            if action.tail_of is not None:
                message += f"\nLast log lines:\n{self.backend.logs_tail(action.tail_of, lines=20)}"
            if action.clean_up is not None:
                self.clean_up(action.clean_up, "fail")
            if action.delete is not None:
                self.backend.delete(action.delete)
            raise RuntimeError(message)
        if isinstance(action, driver.LeaveRunning):
            raise RuntimeError(waiting_failed(action.event, action.attempt))
        if isinstance(action, driver.Relaunch):
            return self._retire(run.context, action.retire, action.delay_s)
        if isinstance(action, driver.Done):
            return None
        assert job is not None, "the driver acts on a run only with its record"
        if isinstance(action, driver.FindLiveJobs):
            live = tuple(self.live_jobs(run.context))
            alive = action.alive_check is not None and not self.backend.all_gone(action.alive_check)
            return self._step(run, job, driver.LiveJobs(live, alive))
        if isinstance(action, driver.Wait):
            if action.adopt:
                job = self._record_intent(run, job, action.attempt)[0]
            train_record.record_handle(
                run.store, run.layout, job, action.attempt, action.handle, at=now_iso()
            )
            return self._wait(run.context, action.handle, run.layout)
        if isinstance(action, driver.Launch):
            return self._launch(run, job, action.attempt)
        assert isinstance(action, driver.Succeed), action
        self.clean_up(action.handle, "finish")
        return train_reads.result(run.store, run.layout, job, action.record)

    def _read_job(self, store: Storage, layout: RunLayout, identity: TaskIdentity) -> JobRecord | None:
        """The run's job.json (None: none yet), refused when another task instance owns it."""
        return train_record.read_job(store, layout, identity)

    def _record_intent(self, run: _Call, job: JobRecord, attempt: int) -> tuple[JobRecord, AttemptLaunch]:
        """Attempt ``attempt``'s launch, and ``job`` with it recorded (intent before action)."""
        launch = train_launch.attempt_launch(
            run.store,
            run.layout,
            self.launch_settings(),
            cluster=self.cluster,
            identity=run.identity,
            attempt=attempt,
            job=job,
            aws_conn_id=self.aws_conn_id,
            log=self.log,
        )
        self.task_labels(run.context)  # on_kill finds every attempt's job by them
        job = train_record.record_intent(
            run.store,
            run.layout,
            job,
            launch.spec,
            manifests=lambda spec: manifests_of(self.cluster, spec),
            at=now_iso(),
            try_number=getattr(run.context.get("ti"), "try_number", None),
        )
        return job, launch

    def _launch(self, run: _Call, job: JobRecord, attempt: int) -> Any:
        job, launch = self._record_intent(run, job, attempt)
        handle = train_record.launch(
            self.backend, run.store, run.layout, job, attempt, launch, at=now_iso(), log=self.log
        )
        return self._wait(run.context, handle, run.layout)

    def _wait(self, context: Any, handle: JobHandle, layout: RunLayout) -> Any:
        """Wait for the attempt (progress lines in the task log, heartbeat watched for a hang)."""
        attempt = int(handle.get("labels", {}).get("trainops/attempt", 1))
        return self.wait_for(
            context,
            handle,
            timeout=self.job_timeout,
            progress_uri=layout.metrics,
            progress_every=self.progress_every,
            aws_conn_id=self.aws_conn_id,
            heartbeat_uri=layout.heartbeat(attempt),
            hang_timeout=self.hang_timeout,
        )

    def _retire(self, context: Any, handle: JobHandle, delay_s: float | None) -> Any:
        """Delete the attempt's job; relaunch once every pod of it is gone (and any back-off
        is over): no old pod may still be writing its emergency checkpoint."""
        self.backend.delete(handle)
        trigger = JobGoneTrigger(
            handle=handle,
            cluster_options=self.cluster_options(),
            not_before=time.time() + delay_s if delay_s else None,
            deadline_s=self.termination_grace_seconds + 120,
        )
        return self.defer_or_wait(context, trigger, "relaunch_when_gone")

    # -- after each attempt ------------------------------------------------------------
    @fail_fast
    def execute_complete(self, context: Any, event: object = None) -> Any:
        """An attempt ended: fold it into job.json, then finish, relaunch or fail."""
        checked = check_event(event, expected=("finished", "timeout", "error", "hung", "deadline"))
        self._check_settings()
        run, job = self._resumed(context)
        ended = train_reads.wait_ended(checked, job, run.store, run.layout, self.backend, self.log)
        return self._step(run, job, ended)

    def record_abandoned(self, context: Any, why: str) -> None:
        """Airflow's deferral timeout won the race against the trigger's ``deadline`` event and
        the live jobs were deleted: record the newest attempt as ``timeout`` (see the driver)."""
        self._step(*self._resumed(context), driver.DeferralFailed(why, self.cluster))

    def relaunch_when_gone(self, context: Any, event: object = None) -> Any:
        """The old attempt's pods are gone (and any back-off is over): launch the next attempt."""
        checked = check_event(event)
        self._check_settings()
        return self._step(*self._resumed(context), driver.Retired(checked))

    def _resumed(self, context: Any) -> tuple[_Call, JobRecord | None]:
        """The call after a deferral, and the run's job.json as it is now (None: missing)."""
        store, layout, identity = self._run(context)
        return _Call(context, store, layout, identity), self._read_job(store, layout, identity)
