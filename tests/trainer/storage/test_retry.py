"""The retry loop (``trainer.storage.retry``) on its own: what it waits, what it logs, when it
gives up and what it says then. The same loop under real faults is in ``test_s3.py``."""

from __future__ import annotations

import logging
import re
import threading
import time

import pytest

from trainer.storage import StorageError, StorageUnavailable
from trainer.storage.retry import (
    DEFAULT_OUTAGE_TOLERANCE_S,
    MAX_DELAY_S,
    Abandoned,
    Retrier,
    backoff_delay,
    outage_tolerance,
)


def _flaky(exc: BaseException) -> str | None:
    return "connection lost (ConnectionResetError)" if isinstance(exc, ConnectionResetError) else None


def _failing(times: int, then: object = "done"):
    """An attempt that fails ``times`` times with a reset, then returns ``then``; it records
    the retry number it was given each time."""
    seen: list[int] = []

    def attempt(retry: int) -> object:
        seen.append(retry)
        if len(seen) <= times:
            raise ConnectionResetError("reset by peer")
        return then

    return attempt, seen


def test_the_wait_doubles_up_to_a_cap_and_only_its_upper_half_is_drawn():
    assert [backoff_delay(n, 1.0) for n in range(1, 6)] == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.6])
    assert [backoff_delay(n, 0.0) for n in range(1, 4)] == pytest.approx([0.05, 0.1, 0.2])
    assert backoff_delay(30, 0.999) <= MAX_DELAY_S and backoff_delay(10_000, 0.0) == MAX_DELAY_S / 2


def test_transient_failures_are_retried_and_each_retry_logged(caplog):
    attempt, seen = _failing(3)
    with caplog.at_level(logging.INFO, logger="trainer.storage"):
        assert Retrier(10, _flaky).run("PUT", "s3://b/k", attempt) == "done"
    assert seen == [0, 1, 2, 3]
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 4
    for n, line in enumerate(lines[:3], start=1):
        assert re.fullmatch(
            rf"storage: PUT s3://b/k connection lost \(ConnectionResetError\); retry {n} in 0\.\d s, "
            r"0 s of at most 10 s",
            line,
        ), line
    assert re.fullmatch(r"storage: PUT s3://b/k succeeded on retry 3, after 0\.\d s of failures", lines[3])


def test_a_final_failure_is_not_retried():
    seen = []

    def attempt(retry: int) -> None:
        seen.append(retry)
        raise PermissionError("denied")

    with pytest.raises(PermissionError):
        Retrier(10, _flaky).run("GET", "s3://b/k", attempt)
    assert seen == [0]


def test_when_the_tolerance_runs_out_the_error_says_what_failed_and_for_how_long():
    attempt, seen = _failing(1000)
    started = time.monotonic()
    with pytest.raises(StorageUnavailable) as info:
        Retrier(0.3, _flaky).run("PUT", "s3://b/latest.json", attempt, unsure="read it to see")
    assert 0.3 <= time.monotonic() - started < 2
    assert re.fullmatch(
        r"storage: PUT s3://b/latest.json kept failing for 0\.3 s over \d+ tries \(last: connection lost "
        r"\(ConnectionResetError\)\), beyond the outage tolerance of 0\.3 s: check that the storage endpoint "
        r"is up and reachable, or raise TRAINOPS_STORAGE_OUTAGE_TOLERANCE_S; read it to see",
        str(info.value),
    )
    assert f"over {len(seen)} tries" in str(info.value)
    assert isinstance(info.value.__cause__, ConnectionResetError)


def test_a_zero_tolerance_fails_at_the_first_transient_error_without_a_note():
    attempt, seen = _failing(1)
    with pytest.raises(StorageUnavailable, match=r"over 1 try .*OUTAGE_TOLERANCE_S$"):
        Retrier(0, _flaky).run("PUT", "s3://b/k", attempt, unsure="read it to see")
    assert seen == [0]


def test_a_stopped_operation_stops_its_other_requests_without_waiting_out_their_backoff():
    stop = threading.Event()
    attempt, seen = _failing(1000)
    retrier = Retrier(60, _flaky)
    threading.Timer(0.2, stop.set).start()
    started = time.monotonic()
    with pytest.raises(Abandoned, match="another request of the same operation gave up"):
        retrier.run("UploadPart 2", "s3://b/shard", attempt, stop=stop)
    assert time.monotonic() - started < MAX_DELAY_S / 2
    assert retrier.retries == len(seen) - 1


def test_the_tolerance_comes_from_the_caller_then_the_environment_then_the_default(monkeypatch):
    monkeypatch.delenv("TRAINOPS_STORAGE_OUTAGE_TOLERANCE_S", raising=False)
    assert outage_tolerance() == DEFAULT_OUTAGE_TOLERANCE_S == 300
    monkeypatch.setenv("TRAINOPS_STORAGE_OUTAGE_TOLERANCE_S", " 2.5 ")
    assert outage_tolerance() == 2.5
    assert outage_tolerance(0) == 0.0
    monkeypatch.setenv("TRAINOPS_STORAGE_OUTAGE_TOLERANCE_S", "-1")
    with pytest.raises(
        StorageError, match=r"TRAINOPS_STORAGE_OUTAGE_TOLERANCE_S=-1.0 is not a number of seconds >= 0"
    ):
        outage_tolerance()
    for bad in (float("nan"), float("inf"), -3, True, "60"):
        with pytest.raises(StorageError, match=r"outage_tolerance_s=.* is not a number of seconds >= 0"):
            outage_tolerance(bad)  # type: ignore[arg-type]
