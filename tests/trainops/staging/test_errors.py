"""The errors carry no logic of their own: what matters to a user is which of them a retry can
cure (the operator fails a StagingError at once and retries the rest) and that a validation
failure keeps its summary and report."""

import pytest

from trainops.staging.errors import (
    DataValidationError,
    QuarantineExceeded,
    SourceNotFound,
    SourceUnreachable,
    StagingError,
)

SUMMARY = {"success": False, "rows": 30, "failed": [{"expectation": "expect_column_values_to_not_be_null"}]}


@pytest.mark.parametrize("error", [DataValidationError, QuarantineExceeded])
def test_a_validation_failure_is_final_and_keeps_its_report(error):
    exc = error("source 'file:///raw' failed 1 of 6 expectations", SUMMARY, "file:///r/validation.json")
    assert isinstance(exc, StagingError)
    assert str(exc) == "source 'file:///raw' failed 1 of 6 expectations"
    assert (exc.summary, exc.report_uri) == (SUMMARY, "file:///r/validation.json")


def test_a_lost_report_is_none():
    assert DataValidationError("failed", SUMMARY).report_uri is None


def test_too_many_quarantined_rows_is_a_validation_failure():
    with pytest.raises(DataValidationError):
        raise QuarantineExceeded("6 bad rows of 1000", SUMMARY)


@pytest.mark.parametrize(
    "error, builtin",
    [(SourceNotFound, FileNotFoundError), (SourceUnreachable, ConnectionError)],
)
def test_a_missing_or_unreachable_source_may_be_retried(error, builtin):
    exc = error("source_uri 's3://b/raw' does not exist")
    assert isinstance(exc, builtin) and not isinstance(exc, StagingError)
    assert str(exc) == "source_uri 's3://b/raw' does not exist"
