"""``python -m trainops doctor``: check a cluster and a storage root before the first run.

One line per check, pass or fail with the fix (:mod:`trainops.doctor`); exit status 0 only
when nothing fails (warnings are checks that could not be made), 1 when something fails, 2 when
no cluster is configured or an option is bad. Read-only: the only writes are the storage probe's,
under ``<root>/.trainops-doctor/``, deleted again.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict
from typing import Any

from trainer.storage import StorageError, open_storage
from trainops.doctor import checks, cluster
from trainops.doctor.airflow_api import api_check
from trainops.doctor.checks import Check
from trainops.doctor.kube import NoCluster, connect
from trainops.doctor.storage import probe
from trainops.hooks.storage import storage_for

SPOT_FLAVOURS = ("auto", "karpenter", "eks", "gke", "aks")


def add_parser(sub: Any) -> None:
    doctor = sub.add_parser(
        "doctor",
        help="check a cluster and a storage root before the first run (read-only)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    where = doctor.add_argument_group("the cluster (the first one given is used)")
    where.add_argument("--kubernetes-conn-id", default=None, help="an Airflow Kubernetes connection")
    where.add_argument(
        "--kubeconfig", default=None, help="a kubeconfig (default: $KUBECONFIG, ~/.kube/config)"
    )
    where.add_argument("--context", default=None, help="the kubeconfig context (default: its current one)")
    where.add_argument(
        "--namespace", default=None, help="the job namespace (default: the config's, else default)"
    )
    job = doctor.add_argument_group("what the first run asks for (the operators' defaults)")
    job.add_argument("--kind", default="indexed-job", choices=("indexed-job", "pytorchjob", "trainjob"))
    job.add_argument("--scheduler", default="default", help="default, kueue:<queue>, volcano[:<queue>]")
    job.add_argument("--capacity", default="spot", choices=("spot", "on-demand", "spot-then-on-demand"))
    job.add_argument("--spot-flavour", default="auto", choices=SPOT_FLAVOURS)
    job.add_argument("--gpus-per-node", type=int, default=8)
    job.add_argument("--grace-seconds", type=int, default=60, help="termination_grace_seconds")
    job.add_argument(
        "--save-seconds",
        type=float,
        default=None,
        help="how long an emergency checkpoint takes (an attempt record's emergency_save_s)",
    )
    store = doctor.add_argument_group("storage and Airflow")
    store.add_argument("--storage-root", default=None, help="default: $TRAINOPS_STORAGE_ROOT")
    store.add_argument(
        "--aws-conn-id", default=None, help="an Airflow AWS connection (default: boto3's chain)"
    )
    store.add_argument(
        "--airflow-conn-id", default=None, help="the connection notes use (default: trainops_airflow_api)"
    )
    store.add_argument("--no-airflow", action="store_true", help="skip the Airflow API check")
    doctor.add_argument("--json", action="store_true", help="print the checks as JSON")


def _storage(root: str, aws_conn_id: str | None) -> list[Check]:
    try:
        if aws_conn_id:
            store = storage_for(root, aws_conn_id, outage_tolerance_s=15)
        else:
            store = open_storage(root, outage_tolerance_s=15)
    except (StorageError, ValueError) as exc:
        return [Check("storage", checks.FAIL, f"{root}: {exc}", "pass s3://bucket/prefix or file:///path")]
    return checks.storage_checks(root, probe(store, root))


def run(args: argparse.Namespace, *, hook: Any = None, server: str = "") -> list[Check]:
    """Every check, in the table's order (``hook``: a ready client, for tests)."""
    namespace = args.namespace
    if hook is None:
        hook, server, config_namespace = connect(
            conn_id=args.kubernetes_conn_id, kubeconfig=args.kubeconfig, context=args.context
        )
        namespace = namespace or config_namespace
    target = cluster.Target(
        namespace=namespace or "default",
        kind=args.kind,
        scheduler=args.scheduler,
        capacity=args.capacity,
        spot_flavour=args.spot_flavour,
        gpus_per_node=args.gpus_per_node,
    )
    out = cluster.cluster_checks(hook, server, target)
    save_s, source = args.save_seconds, "--save-seconds"
    out.append(checks.notice_check(args.grace_seconds, args.spot_flavour, args.capacity, save_s, source))
    root = args.storage_root or os.environ.get("TRAINOPS_STORAGE_ROOT")
    if root:
        out += _storage(root, args.aws_conn_id)
    else:
        out.append(
            Check(
                "storage",
                checks.FAIL,
                "no storage root given",
                "pass --storage-root s3://bucket/prefix or set TRAINOPS_STORAGE_ROOT",
            )
        )
    if not args.no_airflow:
        conn_id = (
            args.airflow_conn_id
            or os.environ.get("AIRFLOW__TRAINOPS__AIRFLOW_API_CONN_ID")
            or "trainops_airflow_api"
        )
        out.append(api_check(conn_id))
    return out


def table(found: list[Check]) -> str:
    width = max(len(c.name) for c in found)
    lines = [c.line(width) for c in found]
    counts = {s: sum(c.status == s for c in found) for s in (checks.PASS, checks.FAIL, checks.WARN)}
    lines.append(
        f"{len(found)} checks: {counts[checks.PASS]} passed, {counts[checks.FAIL]} failed, "
        f"{counts[checks.WARN]} could not be made"
    )
    return "\n".join(lines)


def main(args: argparse.Namespace, *, hook: Any = None, server: str = "") -> int:
    if args.gpus_per_node < 0 or args.grace_seconds < 1:
        print("doctor: --gpus-per-node must be >= 0 and --grace-seconds >= 1", file=sys.stderr)
        return 2
    if args.scheduler != "default" and args.scheduler.partition(":")[0] not in ("kueue", "volcano"):
        print(
            f"doctor: --scheduler {args.scheduler!r}: expected default, kueue:<queue> or volcano[:<queue>]",
            file=sys.stderr,
        )
        return 2
    try:
        found = run(args, hook=hook, server=server)
    except NoCluster as exc:
        print(f"doctor: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps([asdict(c) for c in found], indent=2))
    else:
        print(table(found))
    return 1 if checks.failed(found) else 0
