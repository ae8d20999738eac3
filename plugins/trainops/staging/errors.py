"""Errors raised while staging a dataset."""

from __future__ import annotations


class StagingError(Exception):
    """The source cannot be staged as it is; retrying without changing it will not help."""


class SourceNotFound(FileNotFoundError):
    """``source_uri`` names nothing readable.

    Not a :class:`StagingError`: an upstream writer may still be producing the source,
    so a retry can succeed.
    """


class SourceUnreachable(ConnectionError):
    """The store holding the source (or the storage root) cannot be reached.

    Not a :class:`StagingError`: an endpoint that is down now may be up on the next try.
    """


class DataValidationError(StagingError):
    """The source failed its expectations; ``summary`` is the validation summary dict.

    ``report_uri`` is where the full report was written (``validation.json`` under the
    version prefix, with no manifest beside it), or None if it could not be written.
    """

    def __init__(self, message: str, summary: dict, report_uri: str | None = None):
        super().__init__(message)
        self.summary = summary
        self.report_uri = report_uri


class QuarantineExceeded(DataValidationError):
    """More rows failed row-level expectations than ``quarantine["max_fraction"]`` allows."""
