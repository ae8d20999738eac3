"""The storage probe on real stores: a file root, moto's S3 over HTTP, and moto behind our
proxy made to drop the conditional-write headers (a store that ignores them)."""

from trainer.storage import open_storage
from trainops.doctor.storage import PROBE_DIR, probe


def test_a_file_root_honours_everything_and_is_left_clean(file_root):
    store = open_storage(file_root)
    found = probe(store, file_root)
    assert found["create_only"] is True and found["compare_and_swap"] is True
    assert found["latency_ms"] >= 0
    assert store.list(f"{file_root}/{PROBE_DIR}/") == []


def test_s3_honours_conditional_writes(s3_root):
    store = open_storage(s3_root, outage_tolerance_s=5)
    found = probe(store, s3_root)
    assert (found["create_only"], found["compare_and_swap"]) == (True, True)
    assert store.list(f"{s3_root}/{PROBE_DIR}/") == []


def test_a_store_that_ignores_conditional_writes_is_caught(faulty_s3_root, s3_faults):
    s3_faults.drop_headers = frozenset({"if-none-match", "if-match"})
    store = open_storage(faulty_s3_root, outage_tolerance_s=5)
    found = probe(store, faulty_s3_root)
    assert (found["create_only"], found["compare_and_swap"]) == (False, False)
    assert store.list(f"{faulty_s3_root}/{PROBE_DIR}/") == []


def test_a_missing_bucket_is_an_error_with_a_fix(s3_root):
    root = "s3://no-such-bucket-for-doctor/root"
    found = probe(open_storage(root, outage_tolerance_s=5), root)
    assert "no-such-bucket-for-doctor" in found["error"] and "bucket exists" in found["fix"]


def test_an_outage_is_an_error_not_a_hang(faulty_s3_root, s3_faults):
    s3_faults.blackout(mode="refuse")
    found = probe(open_storage(faulty_s3_root, outage_tolerance_s=1), faulty_s3_root)
    assert found["error"].startswith("StorageUnavailable")


class RefusesConditions:
    """A store that answers a conditional write with an error (some S3-compatible servers
    answer 501 Not Implemented) instead of ignoring it."""

    def __init__(self, inner):
        self.inner = inner

    def put(self, uri, data, *, if_none_match=False, if_match=None):
        from trainer.storage import StorageError

        if if_none_match or if_match is not None:
            raise StorageError(
                f"write of {uri!r} failed: 501 NotImplemented: A header you provided implies functionality that is not implemented"
            )
        return self.inner.put(uri, data)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_a_store_that_refuses_the_headers_outright_is_named_as_such(file_root):
    from trainops.doctor.checks import storage_checks

    found = probe(RefusesConditions(open_storage(file_root)), file_root)
    assert found["create_only"] is False and "501" in found["create_only_error"]
    storage, conditional = storage_checks(file_root, found)
    assert storage.status == "pass"  # plain writes and reads work
    assert (
        conditional.status == "fail"
        and "refused If-None-Match (create-only) and If-Match" in conditional.detail
    )
