"""``job_options``: the JobSpec fields a DAG author may set, checked when the DAG is parsed, and
merged with what the operator sets itself when a job is launched."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from trainops.cluster.kubernetes.render import render_manifests
from trainops.cluster.spec import JobSpec

# JobSpec fields the operators set themselves, and what to do instead of job_options.
OPERATOR_OWNED = {
    "name": "the operator names each attempt's job after the task",
    "args": "the operator builds the trainer command from trainer_config",
    "distributed": "the operator decides (training: torchrun; evaluation: one process)",
    **{
        f: f"use the operator's {f!r} parameter"
        for f in ("nodes", "gpus_per_node", "image", "namespace", "capacity", "termination_grace_seconds")
    },
    "restarts_in_place": (
        "use the training operator's 'restarts_in_place' parameter (a one-process job has no torchrun to restart it)"
    ),
}


def check_job_options(options: Mapping[str, Any] | None, **operator_fields: Any) -> dict[str, Any]:
    """Validate ``job_options`` (extra JobSpec fields for the cluster: kind, scheduler,
    spot_flavour, cpu, memory, env_from_secrets, service_account, node_selector, ...) at DAG
    parse time, on every cluster, so a typo fails before anything runs. Returns a copy.

    :param operator_fields: the JobSpec fields the operator sets from its own parameters
        (``image``, ``namespace``), checked in the same trial JobSpec.
    """
    checked = dict(options or {})
    allowed = sorted(f.name for f in dataclasses.fields(JobSpec) if f.name not in OPERATOR_OWNED)
    for key in checked:
        if key in OPERATOR_OWNED:
            raise ValueError(f"job_options must not set {key!r}: {OPERATOR_OWNED[key]}")
        if key not in allowed:
            raise ValueError(f"job_options has an unknown field {key!r}; known fields: {allowed}")
    JobSpec(name="check", args=["check"], **operator_fields, **checked)  # JobSpecError names a bad value
    return checked


def merge_job_options(
    options: Mapping[str, Any], *, env: Mapping[str, str], labels: Mapping[str, str]
) -> dict[str, Any]:
    """``options`` with the operator's env and labels merged in; the operator's win, and a user
    value that would be overridden is an error rather than silently dropped."""
    merged = dict(options)
    for field_name, ours in (("env", env), ("labels", labels)):
        theirs = dict(options.get(field_name) or {})
        clash = sorted(k for k in theirs if k in ours and theirs[k] != ours[k])
        if clash:
            raise ValueError(f"job_options {field_name} sets {clash}, which the operator sets itself")
        merged[field_name] = {**theirs, **ours}
    return merged


def check_renders(cluster: str, **fields: Any) -> None:
    """On ``cluster='kubernetes'``, render a trial JobSpec with the operator's settings, so what
    only rendering can refuse (a literal credential in env, a placement or grace period the job
    kind cannot express) fails when the DAG is parsed, not at launch."""
    if cluster != "kubernetes":
        return

    render_manifests(JobSpec(name="check", args=["python", "-m", "trainer", "check"], **fields))
