"""The trainer's account of an attempt: its number, the failure's kind and hint, the record."""

import errno
import json

import pytest
import torch

from trainer.contract import RunLayout
from trainer.runtime.attempts import (
    NETWORK_HINT,
    NODE_HINT,
    NON_FINITE_HINT,
    OOM_HINT,
    STORAGE_HINT,
    CausedError,
    NonFiniteLoss,
    attempt_number,
    cause_of,
    classify_failure,
    failure_hint,
    next_attempt_number,
)
from trainer.storage import NotFound, PreconditionFailed, StorageError, StorageUnavailable, open_storage
from trainer.storage.retry import Abandoned


def test_attempt_number_from_env_or_next_free(tmp_path, monkeypatch):
    layout = RunLayout((tmp_path / "run").as_uri())
    storage = open_storage(layout.run_uri)
    assert next_attempt_number([]) == 1
    assert (
        next_attempt_number(
            ["file:///r/attempts/1.json", "file:///r/attempts/12.json", "file:///r/attempts/x.json"]
        )
        == 13
    )
    monkeypatch.delenv("TRAINOPS_ATTEMPT", raising=False)
    storage.put_json(layout.attempt(2), {})
    assert attempt_number(storage, layout) == 3
    monkeypatch.setenv("TRAINOPS_ATTEMPT", "7")
    assert attempt_number(storage, layout) == 7
    monkeypatch.setenv("TRAINOPS_ATTEMPT", "zero")
    with pytest.raises(ValueError, match="TRAINOPS_ATTEMPT='zero' is not a positive integer"):
        attempt_number(storage, layout)


def test_failure_hints():
    assert failure_hint(NonFiniteLoss(12, float("nan"))) == f"loss became nan at step 12: {NON_FINITE_HINT}"
    # a finite loss in a NonFiniteLoss: the step's gradient norm was not (trainer.runtime.bad_loss)
    assert failure_hint(NonFiniteLoss(3, 5.549)) == (
        f"gradients became non-finite (loss 5.549) at step 3: {NON_FINITE_HINT}"
    )
    assert (
        NON_FINITE_HINT
        == "lower train.lr (e.g. halve it) or scale it linearly with the global batch (linear scaling rule)"
    )
    assert (
        failure_hint(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))
        == f"out of memory: {OOM_HINT}"
    )
    assert (
        OOM_HINT
        == "reduce train.micro_batch_size (keep train.global_batch_size) or set train.activation_checkpointing=full"
    )
    assert "NCCL_SOCKET_IFNAME" in NETWORK_HINT and "firewall" in NETWORK_HINT
    assert failure_hint(KeyError("x")) is None


@pytest.mark.parametrize(
    "exc, kind",
    [
        (NonFiniteLoss(3, float("inf")), "non_finite_loss"),
        (
            torch.OutOfMemoryError(
                "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
                "79.15 GiB of which 1.19 GiB is free."
            ),
            "out_of_memory",
        ),
        (
            RuntimeError(
                "[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate memory: you "
                "tried to allocate 8589934592 bytes. Error code 12 (Cannot allocate memory)"
            ),
            "out_of_memory",
        ),
        (MemoryError(), "out_of_memory"),
        (
            torch.distributed.DistBackendError(
                "NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, remote process exited or there "
                "was a network error, NCCL version 2.21.5\nncclRemoteError: A call failed possibly due to a network error "
                "or a remote process exiting prematurely."
            ),
            "network",
        ),
        (
            torch.distributed.DistBackendError(
                "[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=12, OpType=ALLREDUCE, NumelIn=2, "
                "NumelOut=2, Timeout(ms)=600000) ran for 600012 milliseconds before timing out."
            ),
            "network",
        ),
        (torch.distributed.DistNetworkError("Connection reset by peer"), "network"),
        (
            RuntimeError(
                "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer "
                "[10.0.0.2]:3456"
            ),
            "network",
        ),
        (
            RuntimeError(
                "[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 1800000ms "
                "for recv operation to complete"
            ),
            "network",
        ),
        # a storage timeout is not a collective's, and an unknown bug gets no made-up hint
        (
            RuntimeError('Read timeout on endpoint URL: "http://minio:9000/bucket/runs/r1/metrics.jsonl"'),
            "error",
        ),
        (ValueError("shapes (4, 8) and (4, 9) do not match"), "error"),
    ],
)
def test_failures_are_classified_from_their_type_and_message(exc, kind):
    got, hint = classify_failure(exc)
    assert got == kind
    expected = {"non_finite_loss": NON_FINITE_HINT, "out_of_memory": OOM_HINT, "network": NETWORK_HINT}.get(
        kind
    )
    assert (hint is None) if expected is None else hint.endswith(expected)


def test_the_record_says_how_far_the_attempt_got(tmp_path):
    from trainer.runtime.attempts import Attempt

    layout = RunLayout((tmp_path / "run").as_uri())
    attempt = Attempt(
        open_storage(layout.run_uri), layout, 3, world_size=2, started_at="2026-01-01T00:00:00+00:00"
    )
    attempt.resumed_from_step, attempt.last_step = 20, 27
    attempt.committed(25)  # the checkpointer's on_commit
    record = attempt.write("failed", error="RuntimeError: boom", hint=None)
    stored = json.loads((tmp_path / "run" / "attempts" / "3.json").read_text())
    assert stored == record
    assert (
        stored["outcome"],
        stored["checkpoint_step"],
        stored["steps_lost"],
        stored["resumed_from_step"],
    ) == (
        "failed",
        25,
        2,
        20,
    )
    assert stored["started_at"] == "2026-01-01T00:00:00+00:00" and stored["ended_at"]
    # which of several failing ranks' records stands: tests/trainer/runtime/test_failed_record.py


def _raised_from(outer: Exception, inner: Exception) -> Exception:
    try:
        try:
            raise inner
        except Exception as exc:
            raise outer from exc
    except Exception as caught:
        return caught


def _unavailable(tolerance: str = "0.01") -> StorageUnavailable:
    return StorageUnavailable(
        "storage: PUT s3://b/r/_COMMITTED kept failing for 0.5 s over 3 tries (last: refused (503 "
        f"SlowDown)), beyond the outage tolerance of {tolerance} s"
    )


@pytest.mark.parametrize(
    "exc, kind",
    [
        # an outage: the client retried for its whole tolerance, and a relaunch may outlast it
        (_unavailable(), "storage"),
        (Abandoned("storage: UploadPart 3 s3://b/r/x stopped: another request gave up"), "storage"),
        (OSError(errno.EIO, "Input/output error"), "storage"),  # an NFS mount behind file:// gone
        (OSError(errno.ESTALE, "Stale file handle"), "storage"),
        (_raised_from(RuntimeError("dataset read failed"), _unavailable()), "storage"),
        (CausedError("rank 0: StorageUnavailable: PUT failed", "storage"), "storage"),
        (CausedError("rank 0: DistBackendError: gloo", "network"), "network"),
        (CausedError("rank 1: GPUsMissing: no CUDA", "node"), "node"),
        # the client's final verdict: a relaunch would find the same, whatever the words say
        (NotFound("no object at 's3://b/d/manifest.json'"), "error"),
        (PreconditionFailed("conditional write of 's3://b/x' lost"), "error"),
        (StorageError("write of 's3://b/r/x' failed: a connection was reset, 503 SlowDown"), "error"),
        (OSError(errno.ENOENT, "No such file or directory"), "error"),
        (CausedError("rank 0: NothingToResume: ...", "program"), "error"),
    ],
)
def test_storage_failures_are_told_apart_from_the_programs_by_type(exc, kind):
    got, hint = classify_failure(exc)
    assert got == kind
    assert (
        cause_of(got)
        == {"storage": "storage", "network": "network", "node": "node", "error": "program"}[kind]
    )
    if kind == "storage":
        assert hint == STORAGE_HINT
        assert "relaunched from its last committed checkpoint" in STORAGE_HINT
    if kind == "node":
        assert hint == NODE_HINT


def test_what_the_real_clients_raise_is_classified_by_its_type(tmp_path, moto_server, monkeypatch):
    """The errors come from the storage clients themselves: an endpoint that refuses every
    connection outlasts a short tolerance (an outage); a missing bucket, missing credentials,
    an unsupported URI and an object that is not JSON are the configuration's or the data's,
    and a relaunch would meet them again."""
    import socket

    with socket.socket() as closed:  # a port nothing listens on: every connection is refused
        closed.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{closed.getsockname()[1]}"
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    errors = {}
    with pytest.raises(StorageUnavailable) as outage:
        open_storage("s3://b/r", endpoint_url=dead, outage_tolerance_s=0.3).put("s3://b/r/x", b"1")
    errors["outage"] = outage.value
    with pytest.raises(StorageError) as no_bucket:
        open_storage("s3://b/r", endpoint_url=moto_server).put("s3://no-such-bucket-x/r/x", b"1")
    errors["missing bucket"] = no_bucket.value
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with pytest.raises(StorageError) as no_credentials:
        open_storage("s3://b/r", endpoint_url=moto_server).put("s3://b/r/x", b"1")
    errors["no credentials"] = no_credentials.value
    with pytest.raises(StorageError) as unsupported:
        open_storage("gs://b/r")
    errors["unsupported"] = unsupported.value
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(StorageError) as not_json:
        open_storage("file:///").get_json((tmp_path / "bad.json").as_uri())
    errors["not json"] = not_json.value

    kinds = {what: classify_failure(error)[0] for what, error in errors.items()}
    assert kinds == {
        "outage": "storage",
        "missing bucket": "error",
        "no credentials": "error",  # the words of an outage ("failed"), but a relaunch cannot cure it
        "unsupported": "error",
        "not json": "error",
    }
    assert "Unable to locate credentials" in str(errors["no credentials"])


def test_a_failed_checkpoint_keeps_the_cause_of_what_failed_under_it():
    from trainer.checkpoint.save import CheckpointError

    upload = CheckpointError("checkpoint step 30 was not committed: rank 1: StorageError: 503", "storage")
    assert classify_failure(upload)[0] == "storage"
    background = _raised_from(
        CheckpointError("the checkpoint of step 30 failed in the background", "storage"), upload
    )
    assert classify_failure(background)[0] == "storage"
    assert classify_failure(CheckpointError("checkpoint step 3 holds no 'scheduler' state"))[0] == "error"


def test_the_record_carries_the_cause_and_the_metrics_it_could_not_write(tmp_path):
    from trainer.runtime.attempts import Attempt

    layout = RunLayout((tmp_path / "run").as_uri())
    attempt = Attempt(open_storage(layout.run_uri), layout, 2, world_size=1, started_at=None)
    record = attempt.write("failed", error="StorageError: 503", cause="storage", metrics_unwritten=12)
    assert (record["cause"], record["metrics_unwritten"]) == ("storage", 12)
    assert json.loads((tmp_path / "run" / "attempts" / "2.json").read_text()) == record
    assert "cause" not in attempt.record("completed") and "metrics_unwritten" not in attempt.record(
        "completed"
    )
    assert attempt.record("failed")["cause"] == "program"
