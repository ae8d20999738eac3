"""``s3://`` storage against a real S3 server (moto over HTTP): multipart, clients, secrets, and
the faults of a real network (lost replies, refusals, resets, outages) through a proxy."""

from __future__ import annotations

import hashlib
import logging
import os
import re
import time

import pytest

from trainer.storage import (
    PreconditionFailed,
    S3Storage,
    StorageError,
    StorageUnavailable,
    open_storage,
)


def test_large_file_goes_through_multipart_and_comes_back_identical(s3_root, tmp_path):
    store = open_storage(s3_root)
    payload = os.urandom(20 * 1024 * 1024 + 123)
    local = tmp_path / "shard.bin"
    local.write_bytes(payload)

    etag = store.upload_file(local, f"{s3_root}/ckpt/shard.bin")

    assert etag.endswith("-3")  # 8 MiB + 8 MiB + the rest
    head = store.head(f"{s3_root}/ckpt/shard.bin")
    assert head["size"] == len(payload) and head["etag"] == etag
    store.download_file(f"{s3_root}/ckpt/shard.bin", tmp_path / "back.bin")
    assert (tmp_path / "back.bin").read_bytes() == payload


def test_s3_uri_without_bucket_is_rejected():
    with pytest.raises(StorageError, match="'s3:///x' has no bucket"):
        open_storage("s3:///x")


def test_open_storage_reuses_the_client_for_the_same_options(s3_root, moto_server):
    assert open_storage(s3_root) is open_storage(s3_root + "/elsewhere")
    assert isinstance(open_storage(s3_root), S3Storage)
    other = open_storage(s3_root, endpoint_url=moto_server + "/")
    assert other is not open_storage(s3_root)
    assert open_storage("file:///a") is open_storage("file:///b")


def test_secrets_stay_out_of_errors_and_repr(moto_server):
    store = open_storage(
        "s3://no-such-bucket-here/x",
        endpoint_url=moto_server,
        aws_access_key_id="AKIDSECRETLOOKING",
        aws_secret_access_key="very-secret-value",
    )
    with pytest.raises(StorageError) as info:
        store.put("s3://no-such-bucket-here/x/y", b"1")
    assert "no-such-bucket-here" in str(info.value)
    for text in (str(info.value), repr(store)):
        assert "very-secret-value" not in text and "AKIDSECRETLOOKING" not in text


# --------------------------------------------------------------------------- through faults
# tests/s3_faults.py sits between the client and moto: requests refused (503 SlowDown),
# connections reset before S3 saw them, and replies lost after S3 acted on them. What S3 really
# holds is read past the proxy, straight from moto.


def _try_put(store, uri: str, data: bytes, **conditions) -> str:
    """What the client reported: "won" (with the etag S3 gave the data) or "lost"."""
    try:
        etag = store.put(uri, data, **conditions)
    except PreconditionFailed:
        return "lost"
    assert etag == hashlib.md5(data).hexdigest()
    return "won"


def _lost_replies(s3_faults) -> tuple[int, int]:
    """(replies lost after S3 wrote, replies lost after S3 refused with 412) of conditional PUTs."""
    lost = [e for e in s3_faults.events if e.op == "PUT" and e.action == "reset_after"]
    return sum(e.status == 200 for e in lost), sum(e.status == 412 for e in lost)


@pytest.mark.slow
def test_create_only_writes_with_lost_replies_report_what_happened(faulty_s3_root, s3_faults, moto_server):
    store = open_storage(faulty_s3_root)
    direct = open_storage(faulty_s3_root, endpoint_url=moto_server)  # past the proxy
    uris = [f"{faulty_s3_root}/models/m/versions/{i}/card.json" for i in range(60)]
    for uri in uris[::3]:  # a rival claimed every third version first
        direct.put(uri, b"rival", if_none_match=True)

    s3_faults.inject(reset_after=0.2, ops={"PUT"}, seed=12)
    reported = [_try_put(store, uri, f"ours {i}".encode(), if_none_match=True) for i, uri in enumerate(uris)]
    happened = ["won" if direct.get(uri) == f"ours {i}".encode() else "lost" for i, uri in enumerate(uris)]

    after_write, after_412 = _lost_replies(s3_faults)
    assert after_write >= 5 and after_412 >= 2  # both kinds of lost reply happened
    assert sum(r != h for r, h in zip(reported, happened, strict=True)) == 0  # misreported
    assert happened == ["lost" if i % 3 == 0 else "won" for i in range(60)]  # a rival's win stays lost
    assert all(store.head(u)["write_token"] for u in uris[1::3])


@pytest.mark.slow
def test_compare_and_swap_writes_with_lost_replies_report_what_happened(
    faulty_s3_root, s3_faults, moto_server
):
    store = open_storage(faulty_s3_root)
    direct = open_storage(faulty_s3_root, endpoint_url=moto_server)
    uris = [f"{faulty_s3_root}/models/m{i}/production.json" for i in range(60)]
    read = [direct.put(uri, b'{"version": 1}') for uri in uris]
    for uri in uris[::3]:  # a rival moved every third pointer after we read it
        direct.put(uri, b'{"version": 2, "by": "rival"}')

    s3_faults.inject(reset_after=0.2, ops={"PUT"}, seed=5)
    reported = [
        _try_put(store, uri, f'{{"version": 2, "by": "ours {i}"}}'.encode(), if_match=etag)
        for i, (uri, etag) in enumerate(zip(uris, read, strict=True))
    ]
    happened = ["won" if b"ours" in direct.get(uri) else "lost" for uri in uris]

    after_write, after_412 = _lost_replies(s3_faults)
    assert after_write >= 5 and after_412 >= 2
    assert sum(r != h for r, h in zip(reported, happened, strict=True)) == 0
    assert happened == ["lost" if i % 3 == 0 else "won" for i in range(60)]


def test_a_retried_plain_write_and_delete_are_harmless(faulty_s3_root, s3_faults, moto_server):
    store = open_storage(faulty_s3_root)
    direct = open_storage(faulty_s3_root, endpoint_url=moto_server)
    s3_faults.inject(reset_after=1.0, ops={"PUT", "DELETE"}, limit=1)
    assert store.put(f"{faulty_s3_root}/metrics/0001.jsonl", b"{}\n") == hashlib.md5(b"{}\n").hexdigest()
    assert direct.get(f"{faulty_s3_root}/metrics/0001.jsonl") == b"{}\n"
    store.delete(f"{faulty_s3_root}/metrics/0001.jsonl")  # the retry finds nothing: still a success
    assert not direct.exists(f"{faulty_s3_root}/metrics/0001.jsonl")
    assert s3_faults.counts() == {"reset_after": 2, "forwarded": 2}


@pytest.mark.parametrize("fault", ["refuse", "reset_before"])
def test_refusals_and_resets_on_every_operation_are_retried(faulty_s3_root, s3_faults, tmp_path, fault):
    from trainer.storage.base import _PART_SIZE

    store, root = open_storage(faulty_s3_root), faulty_s3_root
    payload = os.urandom(2 * _PART_SIZE + 5)
    (tmp_path / "big.bin").write_bytes(payload)
    (tmp_path / "small.bin").write_bytes(b"s" * 100)

    s3_faults.inject(**{fault: 1.0}, limit=1)  # the first request of each operation fails
    first = store.put(f"{root}/a", b"1")
    second = store.put(f"{root}/a", b"2", if_match=first)
    store.put_json(f"{root}/b.json", {"v": 3}, if_none_match=True)
    assert store.get_with_etag(f"{root}/a") == (b"2", second)
    assert store.get_json(f"{root}/b.json") == {"v": 3}
    assert store.head(f"{root}/a")["size"] == 1 and store.head(f"{root}/none") is None
    store.upload_file(tmp_path / "small.bin", f"{root}/small.bin")
    big = store.upload_file(tmp_path / "big.bin", f"{root}/big.bin")
    store.download_file(f"{root}/big.bin", tmp_path / "back.bin")
    store.copy(f"{root}/a", f"{root}/c")
    assert store.list(root) == [f"{root}/{k}" for k in ("a", "b.json", "big.bin", "c", "small.bin")]
    store.delete(f"{root}/c")
    assert store.delete_prefix(root) == 4
    assert store.list(root) == []

    assert (tmp_path / "back.bin").read_bytes() == payload and big.endswith("-3")
    action = {"refuse": "refused", "reset_before": "reset_before"}[fault]
    hit = {e.op for e in s3_faults.events if e.action == action}
    every = {"PUT", "GET", "HEAD", "LIST", "DELETE", "COPY", "PART", "CREATE_MULTIPART", "COMPLETE_MULTIPART"}
    assert hit >= every, every - hit


def test_a_multipart_upload_with_lost_part_and_complete_replies_completes(
    faulty_s3_root, s3_faults, tmp_path
):
    from trainer.storage.base import _PART_SIZE

    store = open_storage(faulty_s3_root)
    payload = os.urandom(3 * _PART_SIZE + 1)
    (tmp_path / "shard.bin").write_bytes(payload)
    s3_faults.inject(reset_after=1.0, ops={"PART", "COMPLETE_MULTIPART"}, limit=2)

    etag = store.upload_file(tmp_path / "shard.bin", f"{faulty_s3_root}/ckpt/shard.bin", move=True)

    assert s3_faults.counts("PART") == {"reset_after": 2, "forwarded": 4}
    assert s3_faults.counts("COMPLETE_MULTIPART") == {"reset_after": 2, "forwarded": 1}
    assert not (tmp_path / "shard.bin").exists()
    assert store.head(f"{faulty_s3_root}/ckpt/shard.bin")["etag"] == etag and etag.endswith("-4")
    store.download_file(f"{faulty_s3_root}/ckpt/shard.bin", tmp_path / "back.bin")
    assert (tmp_path / "back.bin").read_bytes() == payload


@pytest.fixture
def s3_forgets_completed_uploads(monkeypatch):
    """S3 may answer a repeated CompleteMultipartUpload with NoSuchUpload ("the upload may have
    been completed"); moto answers with the object. Make the double answer as S3 may."""
    from moto.s3.exceptions import NoSuchUpload
    from moto.s3.responses import S3Response

    original = S3Response._key_response_post

    def post(self, request, body, bucket_name, query, key_name):
        upload = (query.get("uploadId") or [None])[0]
        if upload and upload not in self.backend.get_bucket(bucket_name).multiparts:
            raise NoSuchUpload(upload)
        return original(self, request, body, bucket_name, query, key_name)

    monkeypatch.setattr(S3Response, "_key_response_post", post)


def test_a_lost_complete_reply_answered_no_such_upload_is_recognised(
    faulty_s3_root, s3_faults, s3_forgets_completed_uploads, tmp_path
):
    from trainer.storage.base import _PART_SIZE

    store = open_storage(faulty_s3_root)
    payload = os.urandom(_PART_SIZE + 1)
    (tmp_path / "shard.bin").write_bytes(payload)
    s3_faults.inject(reset_after=1.0, ops={"COMPLETE_MULTIPART"}, limit=1)

    etag = store.upload_file(tmp_path / "shard.bin", f"{faulty_s3_root}/ckpt/shard.bin")

    assert [e.status for e in s3_faults.events if e.op == "COMPLETE_MULTIPART"] == [200, 404]
    assert store.head(f"{faulty_s3_root}/ckpt/shard.bin")["etag"] == etag
    assert store.get(f"{faulty_s3_root}/ckpt/shard.bin") == payload


@pytest.mark.parametrize(
    "mode, reason", [("refuse", r"refused \(503 SlowDown\)"), ("reset", "connection lost")]
)
def test_a_blackout_shorter_than_the_tolerance_is_waited_out(faulty_s3_root, s3_faults, caplog, mode, reason):
    # An outage of minutes against a tolerance of minutes, scaled down: 1 s against 5 s.
    store = open_storage(faulty_s3_root, outage_tolerance_s=5)
    uri = f"{faulty_s3_root}/checkpoints/latest.json"
    s3_faults.blackout(1.0, mode=mode)
    started, retries_before = time.monotonic(), store.retries
    with caplog.at_level(logging.INFO, logger="trainer.storage"):
        store.put_json(uri, {"step": 40}, if_none_match=True)

    assert time.monotonic() - started >= 1.0
    assert store.get_json(uri) == {"step": 40}
    lines = [r.getMessage() for r in caplog.records if r.name == "trainer.storage"]
    assert re.fullmatch(
        rf"storage: PUT {re.escape(uri)} {reason}.*; retry 1 in 0\.\d s, 0 s of at most 5 s", lines[0]
    )
    retries = len(lines) - 1
    assert retries >= 3 and store.retries - retries_before == retries
    # The backoff is jittered, so the last wait may overrun the blackout by up to one backoff
    # step; what the user reads is how long it failed, which is at least the blackout and
    # within the tolerance.
    last = re.fullmatch(
        rf"storage: PUT {re.escape(uri)} succeeded on retry {retries}, after (\d+\.\d) s of failures",
        lines[-1],
    )
    assert last and 0.9 <= float(last.group(1)) < 5.0


def test_a_blackout_longer_than_the_tolerance_fails_naming_what_and_how_long(faulty_s3_root, s3_faults):
    store = open_storage(faulty_s3_root, outage_tolerance_s=0.5)
    uri = f"{faulty_s3_root}/checkpoints/latest.json"
    s3_faults.blackout()
    with pytest.raises(StorageUnavailable) as info:
        store.put_json(uri, {"step": 40}, if_none_match=True)
    assert re.fullmatch(
        rf"storage: PUT {re.escape(uri)} kept failing for 0\.[5-9] s over \d+ tries \(last: refused \(503 "
        r"SlowDown\)\), beyond the outage tolerance of 0\.5 s: check that the storage endpoint is up and "
        r"reachable, or raise TRAINOPS_STORAGE_OUTAGE_TOLERANCE_S; the write may have taken effect: "
        r"read the object to see",
        str(info.value),
    )
    assert isinstance(info.value, ConnectionError)  # what a classifier of infrastructure failures sees
    with pytest.raises(StorageUnavailable, match=r"GET .*latest.json kept failing"):
        store.get(uri)
    s3_faults.end_blackout()
    assert not store.exists(uri)


def test_the_outage_tolerance_comes_from_the_environment(s3_root, monkeypatch):
    monkeypatch.setenv("TRAINOPS_STORAGE_OUTAGE_TOLERANCE_S", "42")
    assert open_storage(s3_root).outage_tolerance_s == 42
    assert open_storage(s3_root, outage_tolerance_s=7).outage_tolerance_s == 7
    monkeypatch.delenv("TRAINOPS_STORAGE_OUTAGE_TOLERANCE_S")
    assert open_storage(s3_root).outage_tolerance_s == 300
    assert "outage_tolerance_s=300" in repr(open_storage(s3_root))
    monkeypatch.setenv("TRAINOPS_STORAGE_OUTAGE_TOLERANCE_S", "5m")
    with pytest.raises(
        StorageError, match="TRAINOPS_STORAGE_OUTAGE_TOLERANCE_S='5m' is not a number of seconds"
    ):
        open_storage(s3_root)


def _client_error(code: str, status: int):
    from botocore.exceptions import ClientError

    return ClientError({"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}, "PutObject")


def test_which_failures_are_retried():
    from botocore import exceptions as bx

    from trainer.storage.s3 import _TransientResponse, transient

    url = "http://s3.example"
    assert transient(_client_error("SlowDown", 503)) == "refused (503 SlowDown)"
    assert transient(_client_error("503", 503)) == "refused (503)"  # a HEAD's error has no body
    assert transient(_client_error("InternalError", 500)) == "failed (500 InternalError)"
    assert transient(_client_error("ConditionalRequestConflict", 409)).startswith("conflicted")
    assert transient(bx.ConnectionClosedError(endpoint_url=url)) == "connection lost (ConnectionClosedError)"
    assert transient(bx.ReadTimeoutError(endpoint_url=url)) == "timed out (ReadTimeoutError)"
    assert transient(bx.EndpointConnectionError(endpoint_url=url)) == "unreachable (EndpointConnectionError)"
    assert transient(bx.FlexibleChecksumError(error_msg="crc32")) == "arrived damaged (FlexibleChecksumError)"
    assert transient(_TransientResponse("failed for 2 keys (SlowDown)")) == "failed for 2 keys (SlowDown)"
    for final in (
        _client_error("PreconditionFailed", 412),
        _client_error("NoSuchKey", 404),
        _client_error("AccessDenied", 403),
        bx.SSLError(endpoint_url=url, error="bad certificate"),
        StorageUnavailable("already waited"),
        ValueError("a bug"),
    ):
        assert transient(final) is None, final


def test_a_hashed_download_retried_after_a_reset_checksums_only_the_bytes_of_the_try_that_worked(
    faulty_s3_root, s3_faults, tmp_path
):
    store = open_storage(faulty_s3_root)
    payload = os.urandom(2 * 1024 * 1024)
    store.put(f"{faulty_s3_root}/data/shard.bin", payload)
    s3_faults.inject(reset_after=1.0, ops={"GET"}, limit=1)
    got = store.download_file_hashed(f"{faulty_s3_root}/data/shard.bin", tmp_path / "shard.bin")
    assert s3_faults.counts("GET") == {"reset_after": 1, "forwarded": 1}
    assert got == (len(payload), hashlib.sha256(payload).hexdigest())
    assert (tmp_path / "shard.bin").read_bytes() == payload
