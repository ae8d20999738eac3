"""Fixtures shared by the whole suite."""

from __future__ import annotations

import functools
import os
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

# --------------------------------------------------------------------------- airflow
# Before anything imports Airflow: a private AIRFLOW_HOME (SQLite) and storage root inside the
# checkout, so tests never touch the demo's state or a developer's own Airflow.
# Under pytest-xdist each worker (gw0, gw1, ...) gets its own: SQLite takes one writer at a time,
# and two workers' `airflow db migrate` or dag.test() on one file would lock each other out.
REPO = Path(__file__).resolve().parents[1]
TEST_STATE = REPO / ".trainops-test" / os.environ.get("PYTEST_XDIST_WORKER", "main")
os.environ.update(
    {
        "AIRFLOW_HOME": str(TEST_STATE / "airflow"),
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{TEST_STATE / 'airflow' / 'airflow.db'}",
        "TRAINOPS_STORAGE_ROOT": f"file://{TEST_STATE / 'storage'}",
        "TRAINOPS_LOCAL_STATE": str(TEST_STATE / "local"),
        # dag.test() runs triggers in-process: no scheduler to race (trainops.triggers.job).
        # tests/e2e/test_real_airflow.py puts the default back for its real scheduler.
        "AIRFLOW__TRAINOPS__TRIGGER_SETTLE_SECONDS": "0",
    }
)
(TEST_STATE / "airflow").mkdir(parents=True, exist_ok=True)
# One intra-op thread per torch process (in-process tests, torchrun ranks, the demo's nodes):
# the workers already fill the cores, and threads that spin for a busy core only add CPU time.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# The JVMs of the Spark tests (a local session, a Spark Connect server) live for seconds on a few
# MB: the C1 compiler alone and the serial collector spend about a third less CPU on them than
# the server defaults (tiered C2, G1), which suit long jobs on big data, not these.
os.environ.setdefault("JAVA_TOOL_OPTIONS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")


@pytest.fixture(scope="session")
def airflow_db():
    """A migrated Airflow metadata DB for tests that run DAGs (a few seconds, once)."""
    subprocess.run(
        [sys.executable, "-m", "airflow", "db", "migrate"],
        check=True,
        stdout=subprocess.DEVNULL,
        env=os.environ.copy(),
    )
    return os.environ["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]


# --------------------------------------------------------------------------- workers
# `make test` spreads the tests over workers (pytest-xdist, `--dist loadgroup`). A fixture that
# costs seconds and is shared by scope would be made again on every worker that gets one of its
# tests: a module's (the real Airflow, the staged data of a module), and these session ones.
# The tests that share one run on one worker, so each is made once, as in a serial run.
SHARED_SESSION_FIXTURES = ("spark", "reference_run", "demo_first_run")


def shared_group(item: pytest.Item) -> str | None:
    """The worker group of a test that shares an expensive fixture (None: any worker).

    :param item: a collected test.
    """
    used = getattr(item, "_fixtureinfo", None)
    if used is None:  # not a function (a doctest, say): no fixtures to share
        return None
    for name in SHARED_SESSION_FIXTURES:
        if name in used.name2fixturedefs:
            return name
    for defs in used.name2fixturedefs.values():
        if defs[-1].scope in ("module", "class"):
            return item.nodeid.split("::", 1)[0]  # its module: module fixtures live once per module
    return None


# The longest tests start first, so that no worker is left running one of them alone at the end
# while the others are done (a serial run's --durations, heaviest first; a file's tests stay
# together, so its module fixtures are made once). The order changes the wall time, never what a
# test does: each test sets up its own state.
LONGEST_FIRST = (
    "tests/e2e/test_demo_dag.py",
    "tests/e2e/test_real_airflow.py",
    "tests/trainops/staging/spark/",
    "tests/trainops/operators/test_stage_spark.py",
    "tests/e2e/test_quiet_demo.py",
    "tests/e2e/test_home_browser.py",
    "tests/test_trainer_extra.py",
    "tests/e2e/test_hang.py",
    "tests/e2e/test_cost.py",
    "tests/e2e/test_storage_outage.py",
    "tests/trainer/test_train.py",
    "tests/trainer/test_resume.py",
)


def start_rank(path: str, slow: bool) -> int:
    """Where a test file starts: the longest first, then the other slow ones, then the rest.

    :param path: the test file, relative to the checkout.
    :param slow: whether any test in it is marked slow.
    """
    for rank, prefix in enumerate(LONGEST_FIRST):
        if path.startswith(prefix):
            return rank
    return len(LONGEST_FIRST) + (0 if slow else 1)


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        group = None if item.get_closest_marker("xdist_group") else shared_group(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
    if os.environ.get("PYTEST_XDIST_WORKER"):  # the order only matters when workers share the tests
        slow_files = {item.nodeid.split("::", 1)[0] for item in items if item.get_closest_marker("slow")}
        items.sort(
            key=lambda item: start_rank(
                item.nodeid.split("::", 1)[0], item.nodeid.split("::", 1)[0] in slow_files
            )
        )


# --------------------------------------------------------------------------- storage


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _make_moto_conditional_puts_atomic() -> None:
    """Real S3 checks If-Match / If-None-Match and writes as one atomic step. moto checks,
    then writes, so two threads of its server can both pass the check. Serialise moto's
    PutObject (the server runs in this process) so the double behaves like S3; our own
    code gets no such help."""
    import threading

    from moto.s3.responses import S3Response

    if getattr(S3Response.put_object, "_trainops_atomic", False):
        return
    original, lock = S3Response.put_object, threading.Lock()

    def put_object(self, *args, **kwargs):
        with lock:
            return original(self, *args, **kwargs)

    put_object._trainops_atomic = True
    S3Response.put_object = put_object


@pytest.fixture(scope="session")
def moto_server():
    """An S3 server over real HTTP (moto), shared by the session; yields its endpoint URL."""
    from moto.server import ThreadedMotoServer

    _make_moto_conditional_puts_atomic()

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=_free_port(), verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@functools.cache
def _admin_client(endpoint: str):
    # Building a boto3 client takes ~0.5 s; one per server is enough.
    import boto3

    return boto3.session.Session().client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


@pytest.fixture
def s3_root(moto_server, monkeypatch):
    """A fresh bucket on the moto server; yields ``s3://<bucket>/root``.

    The environment points boto3 (and so ``open_storage``) at the server with dummy keys.
    """
    env = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_REGION": "us-east-1",
        "AWS_ENDPOINT_URL_S3": moto_server,
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    for name in ("AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name, raising=False)
    bucket = f"test-{uuid.uuid4().hex[:16]}"
    _admin_client(moto_server).create_bucket(Bucket=bucket)
    yield f"s3://{bucket}/root"


@pytest.fixture
def file_root(tmp_path):
    """An empty ``file://`` storage root inside the test's temporary directory."""
    yield f"file://{tmp_path}/root"


# --------------------------------------------------------------------------- storage faults


@pytest.fixture(scope="session")
def _s3_fault_proxy(moto_server):
    from tests.s3_faults import S3FaultProxy

    with S3FaultProxy(moto_server) as proxy:
        yield proxy


@pytest.fixture
def s3_faults(_s3_fault_proxy):
    """The fault-injecting proxy (``tests/s3_faults.py``) in front of the session's moto server,
    with no faults, no blackout and no events at the start of each test."""
    _s3_fault_proxy.clear()
    yield _s3_fault_proxy
    _s3_fault_proxy.clear()


@pytest.fixture
def faulty_s3_root(s3_faults, moto_server, monkeypatch):
    """Like ``s3_root``, with the environment pointing boto3 at the fault proxy: a fresh bucket
    (made directly on moto, so no fault can stop it); yields ``s3://<bucket>/root``."""
    env = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_REGION": "us-east-1",
        "AWS_ENDPOINT_URL_S3": s3_faults.url,
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    for name in ("AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name, raising=False)
    bucket = f"test-{uuid.uuid4().hex[:16]}"
    _admin_client(moto_server).create_bucket(Bucket=bucket)
    yield f"s3://{bucket}/root"
