"""Errors raised while staging a dataset."""

from __future__ import annotations


class StagingError(Exception):
    """The source cannot be staged as it is; retrying without changing it will not help."""


class SourceNotFound(FileNotFoundError):
    """``source_uri`` names nothing readable.

    Not a :class:`StagingError`: an upstream writer may still be producing the source,
    so a retry can succeed.
    """


class DataValidationError(StagingError):
    """The source failed its expectations; ``summary`` is the validation summary dict."""

    def __init__(self, message: str, summary: dict):
        super().__init__(message)
        self.summary = summary
