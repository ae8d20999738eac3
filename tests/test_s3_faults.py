"""The fault-injecting S3 (``tests/s3_faults.py``), held to what it promises, with a plain boto3
client whose own retries are off: each fault reaches the client as S3 or the network would
deliver it, and what S3 did (or did not do) is read directly from moto."""

from __future__ import annotations

import functools
import http.client
import time
from urllib.parse import urlsplit

import pytest

from tests.s3_faults import Faults, S3FaultProxy, operation


@functools.cache
def _client(endpoint: str):
    import boto3
    from botocore.config import Config

    return boto3.session.Session().client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        config=Config(retries={"total_max_attempts": 1}, s3={"addressing_style": "path"}),
    )


@pytest.fixture
def bucket(faulty_s3_root):
    return urlsplit(faulty_s3_root).netloc


def _moto_has(moto_server, bucket, key) -> bool:
    from botocore.exceptions import ClientError

    try:
        _client(moto_server).head_object(Bucket=bucket, Key=key)
    except ClientError:
        return False
    return True


def test_without_faults_everything_is_relayed(s3_faults, bucket):
    s3 = _client(s3_faults.url)
    s3.put_object(Bucket=bucket, Key="a/b.txt", Body=b"hello")
    assert s3.get_object(Bucket=bucket, Key="a/b.txt")["Body"].read() == b"hello"
    assert s3.head_object(Bucket=bucket, Key="a/b.txt")["ContentLength"] == 5
    assert [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="a/")["Contents"]] == ["a/b.txt"]
    s3.delete_object(Bucket=bucket, Key="a/b.txt")
    assert s3.list_objects_v2(Bucket=bucket).get("KeyCount") == 0
    assert [e.op for e in s3_faults.events] == ["PUT", "GET", "HEAD", "LIST", "DELETE", "LIST"]
    assert s3_faults.counts() == {"forwarded": 6}


def test_head_keeps_s3s_content_length_and_sends_no_body(s3_faults, bucket, moto_server):
    _client(moto_server).put_object(Bucket=bucket, Key="k", Body=b"x" * 1234)

    def signed(method: str) -> str:
        url = _client(s3_faults.url).generate_presigned_url(method, Params={"Bucket": bucket, "Key": "k"})
        return url[len(s3_faults.url) :]

    conn = http.client.HTTPConnection(urlsplit(s3_faults.url).netloc)
    conn.request("HEAD", signed("head_object"))
    head = conn.getresponse()
    assert (head.status, head.getheader("Content-Length"), head.read()) == (200, "1234", b"")
    # A body after the HEAD's headers would be read as the next reply on this connection.
    conn.request("GET", signed("get_object"))
    get = conn.getresponse()
    assert (get.status, len(get.read())) == (200, 1234)
    conn.close()


def test_refuse_answers_503_slowdown_and_s3_never_sees_the_request(s3_faults, bucket, moto_server):
    from botocore.exceptions import ClientError

    s3_faults.inject(refuse=1.0)
    with pytest.raises(ClientError) as info:
        _client(s3_faults.url).put_object(Bucket=bucket, Key="k", Body=b"1")
    error = info.value.response
    assert (error["Error"]["Code"], error["ResponseMetadata"]["HTTPStatusCode"]) == ("SlowDown", 503)
    assert not _moto_has(moto_server, bucket, "k")
    assert s3_faults.counts("PUT") == {"refused": 1}


def test_reset_before_drops_the_connection_and_s3_never_sees_the_request(s3_faults, bucket, moto_server):
    from botocore.exceptions import ConnectionClosedError

    s3_faults.inject(reset_before=1.0)
    with pytest.raises(ConnectionClosedError):
        _client(s3_faults.url).put_object(Bucket=bucket, Key="k", Body=b"1")
    assert not _moto_has(moto_server, bucket, "k")
    assert s3_faults.events[-1].status is None


def test_reset_after_is_the_lost_reply_s3_acted(s3_faults, bucket, moto_server):
    from botocore.exceptions import ConnectionClosedError

    s3_faults.inject(reset_after=1.0)
    with pytest.raises(ConnectionClosedError):
        _client(s3_faults.url).put_object(Bucket=bucket, Key="k", Body=b"1")
    assert _moto_has(moto_server, bucket, "k")
    assert (s3_faults.events[-1].action, s3_faults.events[-1].status) == ("reset_after", 200)


def test_faults_hit_only_the_chosen_operations_in_a_sequence_the_seed_repeats(s3_faults, bucket):
    from botocore.exceptions import ClientError

    s3 = _client(s3_faults.url)
    s3.put_object(Bucket=bucket, Key="k", Body=b"1")

    def outcomes(seed: int) -> list[str]:
        s3_faults.inject(refuse=0.5, ops={"GET"}, seed=seed)
        seen = []
        for _ in range(20):
            s3.head_object(Bucket=bucket, Key="k")  # not chosen: never fails, draws nothing
            try:
                s3.get_object(Bucket=bucket, Key="k")["Body"].read()
                seen.append("ok")
            except ClientError:
                seen.append("refused")
        return seen

    first = outcomes(7)
    assert outcomes(7) == first
    assert 3 <= first.count("refused") <= 17
    assert outcomes(8) != first
    assert s3_faults.counts("HEAD") == {"forwarded": 60}  # none refused


def test_a_limit_fails_only_the_first_requests_of_each_operation(s3_faults, bucket):
    from botocore.exceptions import ClientError

    s3 = _client(s3_faults.url)
    s3_faults.inject(refuse=1.0, limit=2)
    for _ in range(2):
        with pytest.raises(ClientError, match="SlowDown"):
            s3.list_objects_v2(Bucket=bucket)
    s3.list_objects_v2(Bucket=bucket)
    with pytest.raises(ClientError, match="SlowDown"):
        s3.put_object(Bucket=bucket, Key="k", Body=b"1")
    assert [(e.op, e.action) for e in s3_faults.events] == [
        ("LIST", "refused"),
        ("LIST", "refused"),
        ("LIST", "forwarded"),
        ("PUT", "refused"),
    ]


def test_a_blackout_refuses_or_resets_everything_until_it_ends(s3_faults, bucket):
    from botocore.exceptions import ClientError, ConnectionClosedError

    s3 = _client(s3_faults.url)
    s3_faults.blackout()
    with pytest.raises(ClientError, match="SlowDown"):
        s3.list_objects_v2(Bucket=bucket)
    s3_faults.blackout(mode="reset")
    with pytest.raises(ConnectionClosedError):
        s3.list_objects_v2(Bucket=bucket)
    s3_faults.end_blackout()
    s3.list_objects_v2(Bucket=bucket)

    s3_faults.blackout(0.3)
    ends = time.monotonic() + 0.3
    with pytest.raises(ClientError, match="SlowDown"):
        s3.list_objects_v2(Bucket=bucket)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            s3.list_objects_v2(Bucket=bucket)
            break
        except ClientError:
            time.sleep(0.02)
    assert time.monotonic() >= ends
    actions = [e.action for e in s3_faults.events]
    assert actions[:3] == ["refused", "reset_before", "forwarded"] and actions[-1] == "forwarded"
    assert set(actions[3:-1]) == {"refused"}


def test_multipart_requests_are_told_apart(s3_faults, bucket):
    s3 = _client(s3_faults.url)
    upload = s3.create_multipart_upload(Bucket=bucket, Key="big")["UploadId"]
    part = s3.upload_part(Bucket=bucket, Key="big", UploadId=upload, PartNumber=1, Body=b"x" * 10)
    s3.list_parts(Bucket=bucket, Key="big", UploadId=upload)
    s3.complete_multipart_upload(
        Bucket=bucket,
        Key="big",
        UploadId=upload,
        MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": part["ETag"]}]},
    )
    s3.copy_object(Bucket=bucket, Key="copy", CopySource={"Bucket": bucket, "Key": "big"})
    s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": "big"}, {"Key": "copy"}]})
    assert [e.op for e in s3_faults.events] == [
        "CREATE_MULTIPART",
        "PART",
        "LIST_PARTS",
        "COMPLETE_MULTIPART",
        "COPY",
        "DELETE",
    ]


@pytest.mark.parametrize(
    "method, target, headers, op",
    [
        ("GET", "/b?list-type=2&prefix=x%2F", {}, "LIST"),
        ("GET", "/b", {}, "LIST"),
        ("GET", "/b?uploads", {}, "LIST"),
        ("GET", "/b?location", {}, "BUCKET"),
        ("PUT", "/b", {}, "BUCKET"),
        ("HEAD", "/b", {}, "BUCKET"),
        ("HEAD", "/b/k", {}, "HEAD"),
        ("GET", "/b/a/k", {}, "GET"),
        ("PUT", "/b/k", {}, "PUT"),
        ("PUT", "/b/k", {"x-amz-copy-source": "b/j"}, "COPY"),
        ("PUT", "/b/k?partNumber=2&uploadId=u", {}, "PART"),
        ("POST", "/b/k?uploads", {}, "CREATE_MULTIPART"),
        ("POST", "/b/k?uploadId=u", {}, "COMPLETE_MULTIPART"),
        ("DELETE", "/b/k?uploadId=u", {}, "ABORT_MULTIPART"),
        ("GET", "/b/k?uploadId=u", {}, "LIST_PARTS"),
        ("DELETE", "/b/k", {}, "DELETE"),
        ("POST", "/b?delete", {}, "DELETE"),
    ],
)
def test_operation_names_each_kind_of_request(method, target, headers, op):
    assert operation(method, target, headers) == op


def test_bad_fault_settings_are_named():
    with pytest.raises(ValueError, match=r"fault fractions \(0.6, 0.6, 0.0\)"):
        Faults(refuse=0.6, reset_before=0.6)
    with pytest.raises(ValueError, match=r"unknown operations \['PATCH'\]"):
        Faults(refuse=0.1, ops=frozenset({"PATCH"}))
    with pytest.raises(ValueError, match="fault limit -1 must be >= 0"):
        Faults(refuse=0.1, limit=-1)
    with pytest.raises(ValueError, match="must be http://host:port"):
        S3FaultProxy("s3://nowhere")
    with pytest.raises(ValueError, match="blackout mode 'drop'"):
        S3FaultProxy("http://127.0.0.1:1").blackout(mode="drop")  # type: ignore[arg-type]


def test_dropped_headers_make_a_store_that_ignores_conditional_writes(s3_faults, bucket):
    """With If-None-Match and If-Match dropped, S3 never sees the conditions: both writes that
    must fail succeed (what trainops doctor's storage check detects)."""
    from botocore.exceptions import ClientError

    s3 = _client(s3_faults.url)
    s3.put_object(Bucket=bucket, Key="once", Body=b"1", IfNoneMatch="*")
    with pytest.raises(ClientError, match="PreconditionFailed"):
        s3.put_object(Bucket=bucket, Key="once", Body=b"2", IfNoneMatch="*")
    s3_faults.drop_headers = frozenset({"if-none-match", "if-match"})
    s3.put_object(Bucket=bucket, Key="once", Body=b"3", IfNoneMatch="*")
    s3.put_object(Bucket=bucket, Key="once", Body=b"4", IfMatch='"not-its-etag"')
    assert s3.get_object(Bucket=bucket, Key="once")["Body"].read() == b"4"
    s3_faults.clear()
    assert s3_faults.drop_headers == frozenset()
