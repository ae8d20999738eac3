"""The retry policy of Kubernetes API calls: what counts as a blip, back-off, Retry-After and the
budget, on a simulated clock (no real sleeps)."""

import pytest
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import MaxRetryError, ProtocolError, ReadTimeoutError

from trainops.cluster.kubernetes.api_retry import (
    MAX_DELAY_S,
    ApiRetry,
    ApiUnavailable,
    Blip,
    blip,
)

from .fake_k8s import api_error


class Clock:
    def __init__(self):
        self.now, self.slept = 0.0, []

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.slept.append(seconds)
        self.now += seconds


def failing(*errors, result="ok"):
    """A call that raises ``errors`` in turn, then returns ``result``."""
    pending = list(errors)
    calls = []

    def call(*args, **kwargs):
        calls.append((args, kwargs))
        if pending:
            raise pending.pop(0)
        return result

    call.calls = calls
    return call


def too_many(retry_after):
    exc = api_error(429, "Too Many Requests", "Too many requests, please try again later.")
    exc.headers = {"Retry-After": retry_after}
    return exc


def test_what_is_a_blip():
    assert blip(api_error(503, "Service Unavailable", "x")) == Blip("503 Service Unavailable")
    assert blip(api_error(500, "Internal Server Error", "x")).reason == "500 Internal Server Error"
    assert blip(too_many("4")) == Blip("429 Too Many Requests", 4.0)
    assert blip(too_many("Wed, 21 Oct 2015 07:28:00 GMT")).retry_after_s is None  # a date: back-off
    reset = ProtocolError("Connection aborted.", ConnectionResetError(104, "Connection reset by peer"))
    assert "Connection reset by peer" in blip(reset).reason
    assert blip(ConnectionResetError(104, "reset")) and blip(TimeoutError("timed out"))
    assert blip(ReadTimeoutError(None, "/api", "Read timed out.")) and blip(MaxRetryError(None, "/api"))
    for answer in (404, 403, 409, 422, 400, 401):
        assert blip(api_error(answer, "No", "x")) is None
    assert blip(ValueError("a bug")) is None and blip(ApiException(status=0)) is None
    assert blip(ApiUnavailable("spent", 503)) is None  # a nested call's budget is not renewed


def test_blips_are_retried_with_growing_jittered_back_off_up_to_a_cap():
    clock = Clock()
    retry = ApiRetry(600, clock=clock, sleep=clock.sleep, draw=lambda: 0.999)
    call = failing(*[api_error(503, "Service Unavailable", "x")] * 8)
    assert retry.call("list pods", call, "ml", label_selector="a=b") == "ok"
    assert len(call.calls) == 9 and call.calls[0] == (("ml",), {"label_selector": "a=b"})
    assert clock.slept == sorted(clock.slept) and clock.slept[0] < 1
    assert max(clock.slept) == pytest.approx(MAX_DELAY_S, rel=1e-3) and retry.retries == 8
    low = Clock()
    ApiRetry(600, clock=low, sleep=low.sleep, draw=lambda: 0.0).call("x", failing(TimeoutError()))
    assert low.slept == [0.25]  # the lower half of the first delay is never drawn


def test_retry_after_is_honoured_and_one_past_the_budget_gives_up_at_once():
    clock = Clock()
    retry = ApiRetry(60, clock=clock, sleep=clock.sleep)
    assert retry.call("get job", failing(too_many("12"))) == "ok"
    assert clock.slept[0] == 12
    with pytest.raises(ApiUnavailable, match=r"Retry-After 90 s\), beyond the retry budget of 60 s"):
        retry.call("get job", failing(too_many("90")))
    assert len(clock.slept) == 1  # it did not wait


def test_the_budget_bounds_the_consecutive_failures_of_one_call():
    clock = Clock()
    retry = ApiRetry(30, clock=clock, sleep=clock.sleep)
    forever = failing(*[api_error(504, "Gateway Timeout", "x")] * 1000)
    with pytest.raises(ApiUnavailable) as outage:
        retry.call("list pods ml/a=b", forever)
    assert clock.now == pytest.approx(30)  # the last wait is cut to what is left
    assert outage.value.status == 504 and isinstance(outage.value.__cause__, ApiException)
    assert "list pods ml/a=b kept failing for 30.0 s over" in str(outage.value)
    clock.now = 1000.0  # a later call has the whole budget again
    assert retry.call("list pods", failing(api_error(503, "x", "x"))) == "ok"
    with pytest.raises(ApiUnavailable, match="over 1 try"):
        ApiRetry(0, clock=clock, sleep=clock.sleep).call("x", failing(ConnectionResetError()))


def test_answers_and_bugs_are_raised_at_once():
    clock = Clock()
    retry = ApiRetry(60, clock=clock, sleep=clock.sleep)
    for exc in (api_error(404, "Not Found", "x"), api_error(409, "Conflict", "x"), KeyError("bug")):
        call = failing(exc)
        with pytest.raises(type(exc)):
            retry.call("x", call)
        assert len(call.calls) == 1
    assert clock.slept == [] and retry.retries == 0
    with pytest.raises(ValueError, match="api_retry_s must be >= 0 seconds, not -1"):
        ApiRetry(-1)
