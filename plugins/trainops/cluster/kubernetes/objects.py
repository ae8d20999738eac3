"""What every object a launch creates shares, whatever its kind: the ``trainops/job`` label that
finds the attempt's objects and pods again, the queue the JobSpec's scheduler names, and the
object metadata (the user's labels and annotations, the Kueue queue label).
"""

from __future__ import annotations

from typing import Any

from trainops.cluster.kubernetes import names
from trainops.cluster.spec import JobSpec

# A Kubernetes object, or a part of one, in the API's JSON form (camelCase keys). The client
# has no types for them: ``Any`` stops at this edge, records (TypedDicts) begin after it.
Json = dict[str, Any]

JOB_LABEL = "trainops/job"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"


def queue(spec: JobSpec) -> str | None:
    """The Kueue or Volcano queue named by ``scheduler``, if any."""
    _, _, name = spec.scheduler.partition(":")
    return name or None


def is_kueue(spec: JobSpec) -> bool:
    """True when a Kueue LocalQueue admits the job: it is created suspended."""
    return spec.scheduler.startswith("kueue:")


def is_volcano(spec: JobSpec) -> bool:
    """True when Volcano gang-schedules the pods (``volcano`` or ``volcano:<queue>``)."""
    return spec.scheduler.startswith("volcano")


def metadata(spec: JobSpec, name: str) -> Json:
    """The job object's metadata: the user's labels, ``trainops/job``, the Kueue queue label."""
    labels = {**spec.labels, JOB_LABEL: name}
    kueue_queue = queue(spec)
    if is_kueue(spec) and kueue_queue:
        labels[KUEUE_QUEUE_LABEL] = kueue_queue
    meta: Json = {"name": name, "namespace": spec.namespace, "labels": names.labels(labels)}
    if spec.annotations:
        meta["annotations"] = dict(spec.annotations)
    return meta
