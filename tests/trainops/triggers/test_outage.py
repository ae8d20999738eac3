"""Outage: failed reads are counted, backed off and logged once each; the tolerance ends them."""

import logging

from trainops.triggers.outage import Outage, describe, ordinal


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


class ApiException(Exception):
    def __init__(self, status, reason):
        super().__init__(f"({status})\nReason: {reason}\nHTTP response body: a long dump")
        self.status, self.reason = status, reason


def test_ordinals():
    assert [ordinal(n) for n in (1, 2, 3, 4, 11, 12, 13, 21, 22, 101, 111)] == [
        "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "101st", "111th"
    ]  # fmt: skip


def test_describe_is_short():
    assert describe(ApiException(503, "Service Unavailable")) == "ApiException 503 Service Unavailable"
    assert describe(ConnectionResetError("reset\nmore")) == "ConnectionResetError: reset"
    assert describe(TimeoutError()) == "TimeoutError"


def test_backs_off_doubling_logs_each_failure_with_its_count_and_gives_up_past_the_tolerance(caplog):
    clock, log = Clock(), logging.getLogger("test.outage")
    caplog.set_level("INFO", logger="test.outage")
    outage = Outage("status read", 60, log, base_s=1.0, cap_s=8.0, clock=clock)
    delays = []
    for _ in range(5):
        delays.append(outage.failed(ApiException(503, "Service Unavailable")))
        clock.now += 10
    assert delays == [1.0, 2.0, 4.0, 8.0, 8.0]
    assert (
        "status read failed (ApiException 503 Service Unavailable); 3rd failure in 20 s, riding it out up to 60 s"
        in caplog.text
    )
    clock.now = 100 + 58
    assert outage.failed(ConnectionResetError("reset")) == 2.01  # never past the tolerance
    clock.now = 100 + 61
    assert outage.failed(ConnectionResetError("reset")) is None
    assert outage.verdict(ConnectionResetError("reset")).startswith(
        "status read failed for 61 s (7 tries), longer than the api_outage_tolerance of 60 s"
    )


def test_a_read_that_works_logs_the_recovery_once_and_starts_afresh(caplog):
    clock, log = Clock(), logging.getLogger("test.outage")
    caplog.set_level("INFO", logger="test.outage")
    outage = Outage("log read", 10, log, clock=clock)
    outage.failed(OSError("x"))
    clock.now += 9
    outage.failed(OSError("x"))
    outage.worked()
    outage.worked()
    assert caplog.text.count("log read works again after 2 failure(s) over 9 s") == 1
    clock.now += 100
    assert outage.failed(OSError("x")) == 1.0  # a new outage gets the whole tolerance again
    assert outage.total_failures == 3
