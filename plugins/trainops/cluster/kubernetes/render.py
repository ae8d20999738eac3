"""JobSpec -> the Kubernetes manifests that would be submitted, in submission order; and, per job
kind, the labels that find the pods again.

One module per kind builds its objects (:mod:`~trainops.cluster.kubernetes.indexed_job`,
:mod:`~trainops.cluster.kubernetes.pytorchjob`, :mod:`~trainops.cluster.kubernetes.trainjob`).
Recovery is a whole-gang relaunch owned by the operator, so no kind restarts a pod by itself:
``restartPolicy: Never`` everywhere, and each kind fails as a whole on the first disruption
or non-zero exit.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import yaml

from trainops.cluster.base import ObjectRef
from trainops.cluster.kubernetes import indexed_job, pod, pytorchjob, trainjob
from trainops.cluster.kubernetes.objects import JOB_LABEL, Json
from trainops.cluster.spec import JobSpec

# JobSpec kind -> its builder (every kind in ``trainops.cluster.spec.KINDS``)
BUILDERS: dict[str, Callable[[JobSpec], list[Json]]] = {
    "indexed-job": indexed_job.manifests,
    "pytorchjob": pytorchjob.manifests,
    "trainjob": trainjob.manifests,
}
# JobSpec kind -> (apiVersion, kind) of its job object, the last manifest
JOB_OBJECTS = {
    "indexed-job": (indexed_job.API_VERSION, indexed_job.KIND),
    "pytorchjob": (pytorchjob.API_VERSION, pytorchjob.KIND),
    "trainjob": (trainjob.API_VERSION, trainjob.KIND),
}
# the job object's API kind -> JobSpec kind (what a handle's ``kind`` says)
JOB_KINDS = {api_kind: kind for kind, (_, api_kind) in JOB_OBJECTS.items()}


def _build(spec: JobSpec, trainjob_api: trainjob.TrainJobApi) -> list[Json]:
    if spec.kind == "trainjob":
        return trainjob.manifests(spec, trainjob_api)
    return BUILDERS[spec.kind](spec)


def render_manifests(spec: JobSpec, trainjob_api: trainjob.TrainJobApi = trainjob.CURRENT) -> list[Json]:
    """The manifests for ``spec`` (plain dicts), in the order to create them: Service and
    PodGroup before the Job, so the pods find them; a TrainJob for the Trainer release
    ``trainjob_api`` describes (the backend reads it from the cluster). Raises JobSpecError
    naming a bad value, and every variable that looks like a literal credential (its value
    never)."""
    pod.refuse_literal_credentials(spec)
    return _build(spec, trainjob_api)


def review_manifests(
    spec: JobSpec, trainjob_api: trainjob.TrainJobApi = trainjob.CURRENT
) -> tuple[list[Json], str | None]:
    """What a dry run shows of ``spec``: its manifests with every credential-like literal value
    masked (``***``), and why launching it would be refused for them (None: it would not).
    Raises JobSpecError naming any other bad value, as :func:`render_manifests` does."""
    return _build(pod.masked(spec), trainjob_api), pod.credential_refusal(spec)


def job_ref(kind: str, job: str) -> ObjectRef:
    """The job object of kind ``kind`` (a JobSpec kind) named ``job``."""
    api_version, api_kind = JOB_OBJECTS[kind]
    return {"apiVersion": api_version, "kind": api_kind, "name": job}


def object_refs(kind: str, job: str) -> list[ObjectRef]:
    """Every object a launch of the job ``job`` may have created, in creation order: what a
    reattached handle deletes."""
    if kind == "indexed-job":
        return indexed_job.object_refs(job)
    return [job_ref(kind, job)]


def pod_selector(kind: str, job: str) -> dict[str, str]:
    """The labels that select an attempt's pods, for a job named ``job``
    (``names.job_name``). ``trainops/job`` reaches the pods of an Indexed Job and a
    PyTorchJob; a TrainJob cannot label its pods, so those are selected by their JobSet's
    labels (the JobSet is named after the TrainJob)."""
    if kind == "trainjob":
        return trainjob.pod_selector(job)
    return {JOB_LABEL: job}


def to_yaml(manifests: list[Json]) -> str:
    """Multi-document YAML, keys in the order they were built."""

    class _NoAliases(yaml.SafeDumper):
        def ignore_aliases(self, data: Any) -> bool:  # readable output even if a dict is shared
            return True

    return yaml.dump_all(manifests, Dumper=_NoAliases, sort_keys=False, default_flow_style=False)
