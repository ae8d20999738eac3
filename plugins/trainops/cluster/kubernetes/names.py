"""Kubernetes names derived from a JobSpec: deterministic, RFC 1123, short enough for what
Kubernetes derives from them.

Kubernetes appends to the job's name: an Indexed Job's pods get the hostname
``<job>-<index>``; the Kubeflow operator names pods and Services ``<job>-master-0`` and
``<job>-worker-<i>``; a TrainJob's JobSet (named after it, with a headless Service of that
name) runs the Job ``<job>-node-0``, whose pods get the hostname ``<job>-node-0-<index>``.
Hostnames, Service names and label values are at most 63 characters, and Service names must
start with a letter. So the Kubernetes name is the JobSpec name when everything derived from
it fits, else a prefix of it plus a hash of the whole name.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping

from trainops.cluster.spec import JobSpec

MAX_LABEL = 63
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


def _digest(value: str, n: int = 8) -> str:
    return hashlib.sha256(value.encode()).hexdigest()[:n]


def name_suffix_length(kind: str, nodes: int) -> int:
    """The longest suffix Kubernetes (or its operator) appends to the job name for ``nodes``."""
    if kind == "pytorchjob":
        worker = len(f"-worker-{nodes - 2}") if nodes > 1 else 0
        return max(len("-master-0"), worker)
    if kind == "trainjob":  # JobSet pods: <trainjob>-node-0-<index>
        return len(f"-node-0-{nodes - 1}")
    return len(f"-{nodes - 1}")  # Indexed Job hostname <job>-<index>


def max_name_length(kind: str, nodes: int) -> int:
    """The longest job name whose derived names (hostnames, Services) still fit."""
    return MAX_LABEL - name_suffix_length(kind, nodes)


def fit_name(name: str, limit: int) -> str:
    """``name`` if it is at most ``limit`` characters and starts with a letter; otherwise a
    deterministic variant that is: a prefix, then ``-`` and 8 hex digits of the whole name."""
    base = name if name[:1].isalpha() else f"j-{name}"
    if len(base) <= limit:
        return base
    if limit < 10:
        raise ValueError(f"no room for a job name in {limit} characters; use fewer nodes")
    head = base[: limit - 9].rstrip("-.")
    return f"{head}-{_digest(name)}"


def job_name(spec: JobSpec) -> str:
    """The name of the job object (and of the Indexed Job's headless Service)."""
    return fit_name(spec.name, max_name_length(spec.kind, spec.nodes))


def service_name(job_name: str) -> str:
    """The headless Service of an Indexed Job: the job's own name (it starts with a letter)."""
    return job_name


def pod_hostnames(spec: JobSpec) -> list[str]:
    """The hostnames of the job's pods, as Kubernetes will set them."""
    job = job_name(spec)
    if spec.kind == "pytorchjob":
        return [f"{job}-master-0", *(f"{job}-worker-{i}" for i in range(spec.nodes - 1))]
    if spec.kind == "trainjob":
        return [f"{job}-node-0-{i}" for i in range(spec.nodes)]
    return [f"{job}-{i}" for i in range(spec.nodes)]


def label_value(value: object) -> str:
    """A valid label value for ``value``: unchanged when valid, else shortened/cleaned with a
    hash suffix (deterministic, so selectors built with this function find the object)."""
    text = str(value)
    if len(text) <= MAX_LABEL and _LABEL_VALUE.match(text):
        return text
    cleaned = re.sub(r"[^A-Za-z0-9_.-]", "_", text).strip("_.-")
    return f"{cleaned[: MAX_LABEL - 9].rstrip('_.-')}-{_digest(text)}".lstrip("-")


def check_label_key(key: str) -> None:
    """Raise ValueError unless ``key`` is ``[prefix/]name`` as Kubernetes requires."""
    prefix, _, name = key.rpartition("/")
    if (
        (prefix and (len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)))
        or len(name) > MAX_LABEL
        or not _LABEL_NAME.match(name)
    ):
        raise ValueError(
            f"label key {key!r} is not a Kubernetes label key: use [dns-prefix/]name "
            "with a name of at most 63 letters, digits, '-', '_' or '.'"
        )


def labels(values: Mapping[str, str]) -> dict[str, str]:
    """Check the keys and fit the values of a label map."""
    for key in values:
        check_label_key(key)
    return {key: label_value(value) for key, value in values.items()}
