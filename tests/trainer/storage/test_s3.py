"""``s3://`` storage against a real S3 server (moto over HTTP): multipart, clients, secrets."""

from __future__ import annotations

import os

import pytest

from trainer.storage import (
    S3Storage,
    StorageError,
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
