import re
import socket

import pytest

from trainer.storage import open_storage
from trainer.storage.s3 import S3Storage
from trainops.staging.errors import SourceUnreachable
from trainops.staging.reach import check_reachable, endpoint_of


@pytest.fixture
def listening():
    """An endpoint URL where something accepts TCP connections."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        yield f"http://127.0.0.1:{server.getsockname()[1]}"


@pytest.fixture
def closed():
    """An endpoint URL where nothing listens (the port was free a moment ago)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def test_the_endpoint_is_the_configured_one_or_aws_regional():
    assert endpoint_of(S3Storage(endpoint_url="http://minio:9000")) == "http://minio:9000"
    assert endpoint_of(S3Storage(region="eu-west-1")) == "https://s3.eu-west-1.amazonaws.com"
    assert endpoint_of(S3Storage()) == "https://s3.us-east-1.amazonaws.com"


def test_file_storage_has_no_endpoint_and_is_never_probed(tmp_path):
    storage = open_storage(f"file://{tmp_path}")
    assert endpoint_of(storage) is None
    check_reachable(storage, f"file://{tmp_path}/missing", timeout=0.001)  # nothing to reach


def test_an_endpoint_that_answers_passes(listening):
    check_reachable(S3Storage(endpoint_url=listening), "s3://bucket/raw")


def test_an_endpoint_that_does_not_answer_is_named_with_the_fix(closed):
    with pytest.raises(
        SourceUnreachable,
        match=re.escape(f"cannot reach the S3 endpoint {closed} for 's3://bucket/raw' (Connection refused): ")
        + "check the endpoint_url of the Airflow AWS connection \\(or AWS_ENDPOINT_URL_S3\\) and that the "
        "store is up and reachable from this worker$",
    ) as err:
        check_reachable(S3Storage(endpoint_url=closed), "s3://bucket/raw")
    assert err.value.__cause__ is None and err.value.__suppress_context__  # one line, not a socket trace
