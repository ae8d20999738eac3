"""Storage clients from Airflow connections, talking to a real S3 server (moto over HTTP)."""

from __future__ import annotations

import json
import logging
import time
import uuid

import pytest

from trainer.storage import NotFound, StorageUnavailable, open_storage
from trainops.hooks.storage import (
    DEFAULT_OUTAGE_TOLERANCE_S,
    airflow_outage_tolerance,
    get_json_object,
    job_env_for,
    root_and_storage,
    storage_for,
)


def _define_connection(monkeypatch, conn_id: str, **fields) -> None:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({"conn_type": "aws", **fields}))


@pytest.fixture
def no_env_endpoint(s3_root, monkeypatch):
    """The bucket exists, but nothing in the environment says where the server is."""
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3")
    return s3_root


def test_connection_endpoint_and_keys_reach_the_server(no_env_endpoint, moto_server, monkeypatch):
    root = no_env_endpoint
    _define_connection(
        monkeypatch,
        "trainops_s3",
        login="conn-access-key",
        password="conn-secret-key",
        extra={"endpoint_url": moto_server, "region_name": "us-east-1"},
    )

    store = storage_for(root, "trainops_s3")
    store.put(f"{root}/hello.txt", b"via connection")

    reader = open_storage(root, endpoint_url=moto_server)
    assert reader.get(f"{root}/hello.txt") == b"via connection"
    assert store.list(root) == [f"{root}/hello.txt"]
    assert "conn-secret-key" not in repr(store)


def test_service_config_endpoint_is_accepted(no_env_endpoint, moto_server, monkeypatch):
    root = no_env_endpoint
    _define_connection(
        monkeypatch,
        "minio",
        login="k",
        password="secret-123",
        extra={"service_config": {"s3": {"endpoint_url": moto_server}}},
    )
    store = storage_for(root, "minio")
    store.put(f"{root}/x", b"1")
    assert store.get(f"{root}/x") == b"1"


def test_missing_connection_falls_back_to_environment_and_logs_once(s3_root, caplog):
    caplog.set_level(logging.INFO, logger="trainops.hooks.storage")
    conn_id = f"undefined_{uuid.uuid4().hex[:8]}"  # the note is logged once per process

    store = storage_for(s3_root, conn_id)
    store.put(f"{s3_root}/a", b"env creds")
    storage_for(s3_root, conn_id)

    assert store.get(f"{s3_root}/a") == b"env creds"
    notes = [r.getMessage() for r in caplog.records if conn_id in r.getMessage()]
    assert len(notes) == 1
    assert "default credential chain" in notes[0]
    assert "testing" not in notes[0]


def test_no_connection_id_uses_environment(s3_root):
    store = storage_for(s3_root, None)
    store.put(f"{s3_root}/b", b"1")
    assert store.exists(f"{s3_root}/b")


def test_file_root_needs_no_connection(tmp_path):
    store = storage_for(f"file://{tmp_path}/root", "never_defined_conn")
    store.put(f"file://{tmp_path}/root/x", b"1")
    assert (tmp_path / "root" / "x").read_bytes() == b"1"


def test_job_env_carries_endpoint_and_region_but_no_keys(monkeypatch):
    for name in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_REGION", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name, raising=False)
    _define_connection(
        monkeypatch,
        "trainops_s3",
        login="AKIAEXAMPLEKEY",
        password="wJalrXUtnFEMI-secret",
        extra={
            "endpoint_url": "http://minio.storage:9000",
            "region_name": "eu-west-1",
            "aws_session_token": "session-token-value",
        },
    )

    env = job_env_for("s3://bucket/root", "trainops_s3")

    assert env == {"AWS_ENDPOINT_URL_S3": "http://minio.storage:9000", "AWS_REGION": "eu-west-1"}


def test_a_connection_endpoints_userinfo_never_reaches_the_job_and_the_log_says_so(monkeypatch, caplog):
    for name in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_REGION", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name, raising=False)
    _define_connection(
        monkeypatch,
        "minio_userinfo",
        extra={
            "endpoint_url": "http://minio-admin:minio-pw-0013@minio.storage:9000/s3",
            "region_name": "eu-west-1",
        },
    )
    caplog.set_level(logging.WARNING, logger="trainops.hooks.storage")

    env = job_env_for("s3://bucket/root", "minio_userinfo")

    assert env == {"AWS_ENDPOINT_URL_S3": "http://minio.storage:9000/s3", "AWS_REGION": "eu-west-1"}
    logged = caplog.text
    assert "minio_userinfo" in logged and "userinfo" in logged and "env_from_secrets" in logged
    assert "minio-pw-0013" not in logged and "minio-admin" not in logged


def test_an_environment_endpoints_userinfo_is_dropped_too(monkeypatch, caplog):
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://user:env-pw-0014@ceph:7480")
    monkeypatch.delenv("AWS_REGION", raising=False)
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    caplog.set_level(logging.WARNING, logger="trainops.hooks.storage")

    env = job_env_for("s3://bucket/root", "never_defined_conn")

    assert env == {"AWS_ENDPOINT_URL_S3": "http://ceph:7480"}
    assert "AWS_ENDPOINT_URL_S3" in caplog.text and "env-pw-0014" not in caplog.text


def test_the_airflow_side_client_reaches_a_userinfo_endpoint_without_keeping_the_password(
    no_env_endpoint, moto_server, monkeypatch
):
    root = no_env_endpoint
    host = moto_server.split("://", 1)[1]
    _define_connection(
        monkeypatch,
        "moto_userinfo",
        login="k",
        password="secret-123",
        extra={"endpoint_url": f"http://someone:url-pw-0015@{host}"},
    )
    store = storage_for(root, "moto_userinfo")
    store.put(f"{root}/y", b"1")
    assert store.get(f"{root}/y") == b"1"
    assert "url-pw-0015" not in repr(store)


def test_job_env_without_connection_uses_environment(monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://ceph:7480")
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "ap-south-1")
    monkeypatch.delenv("AWS_REGION", raising=False)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "do-not-forward")

    env = job_env_for("s3://bucket/root", "never_defined_conn")

    assert env == {"AWS_ENDPOINT_URL_S3": "http://ceph:7480", "AWS_REGION": "ap-south-1"}


def test_job_env_for_real_aws_without_settings_is_empty(monkeypatch):
    for name in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_REGION", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name, raising=False)
    assert job_env_for("s3://bucket/root", None) == {}


def test_job_env_for_file_root_is_empty(tmp_path):
    assert job_env_for(f"file://{tmp_path}", "trainops_s3") == {}


def test_an_operators_storage_is_its_root_or_the_default_one(file_root, monkeypatch):
    monkeypatch.setenv("TRAINOPS_STORAGE_ROOT", file_root)
    root, store = root_and_storage(None, None)
    assert root == file_root
    store.put_json(f"{root}/record.json", {"status": "running"})
    assert root_and_storage(file_root, None)[1].get_json(f"{root}/record.json") == {"status": "running"}


def test_a_record_must_be_a_json_object(file_root):
    store = open_storage(file_root)
    store.put_json(f"{file_root}/ok.json", {"step": 3})
    store.put_json(f"{file_root}/list.json", [3])
    assert get_json_object(store, f"{file_root}/ok.json") == {"step": 3}
    with pytest.raises(ValueError, match=r"list.json holds a JSON list, not an object"):
        get_json_object(store, f"{file_root}/list.json")
    with pytest.raises(NotFound):
        get_json_object(store, f"{file_root}/missing.json")


# ------------------------------------------------------------------------- outage tolerance


def test_the_airflow_side_rides_out_outages_for_two_minutes_by_default(monkeypatch):
    monkeypatch.delenv("AIRFLOW__TRAINOPS__STORAGE_OUTAGE_TOLERANCE", raising=False)
    assert airflow_outage_tolerance() == DEFAULT_OUTAGE_TOLERANCE_S == 120.0
    monkeypatch.setenv("AIRFLOW__TRAINOPS__STORAGE_OUTAGE_TOLERANCE", "30")
    assert airflow_outage_tolerance() == 30.0


@pytest.mark.parametrize("value", ["soon", "-1", "inf"])
def test_a_bad_tolerance_setting_is_named(monkeypatch, value):
    monkeypatch.setenv("AIRFLOW__TRAINOPS__STORAGE_OUTAGE_TOLERANCE", value)
    with pytest.raises(ValueError) as err:
        storage_for("s3://bucket/root", None)
    assert str(err.value) == (
        f"[trainops] storage_outage_tolerance is {value!r}, not a number of seconds >= 0: set it (or "
        "AIRFLOW__TRAINOPS__STORAGE_OUTAGE_TOLERANCE) to e.g. 120, or unset it for the default"
    )


def test_an_operators_request_fails_after_the_configured_outage_tolerance(
    faulty_s3_root, s3_faults, monkeypatch
):
    # The tolerance is scaled down from the default two minutes to one second.
    monkeypatch.setenv("AIRFLOW__TRAINOPS__STORAGE_OUTAGE_TOLERANCE", "1")
    monkeypatch.setenv("TRAINOPS_STORAGE_OUTAGE_TOLERANCE_S", "300")  # the trainer's, not the worker's
    store = storage_for(faulty_s3_root, None)
    store.put(f"{faulty_s3_root}/job.json", b"{}")
    s3_faults.blackout()
    started = time.monotonic()
    with pytest.raises(StorageUnavailable) as err:
        store.get(f"{faulty_s3_root}/job.json")
    assert time.monotonic() - started < 10
    assert "beyond the outage tolerance of 1 s" in str(err.value)
    assert "refused (503 SlowDown)" in str(err.value)
    s3_faults.end_blackout()
    assert store.get(f"{faulty_s3_root}/job.json") == b"{}"


def test_job_env_passes_the_deployments_trainer_tolerance(monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://minio:9000")
    monkeypatch.delenv("TRAINOPS_STORAGE_OUTAGE_TOLERANCE_S", raising=False)
    assert "TRAINOPS_STORAGE_OUTAGE_TOLERANCE_S" not in job_env_for("s3://bucket/root", None)
    monkeypatch.setenv("TRAINOPS_STORAGE_OUTAGE_TOLERANCE_S", "600")
    assert job_env_for("s3://bucket/root", None)["TRAINOPS_STORAGE_OUTAGE_TOLERANCE_S"] == "600"


def test_a_bad_trainer_tolerance_fails_before_a_job_is_launched(monkeypatch):
    monkeypatch.setenv("TRAINOPS_STORAGE_OUTAGE_TOLERANCE_S", "five minutes")
    with pytest.raises(
        ValueError, match=r"TRAINOPS_STORAGE_OUTAGE_TOLERANCE_S='five minutes' is not a number"
    ):
        job_env_for("s3://bucket/root", None)
