"""Driving an operator by hand, as the worker and the triggerer would: a call that must defer,
and a trigger run for real up to its first event."""

from __future__ import annotations

import asyncio

import pytest
from airflow.sdk.exceptions import TaskDeferred


def deferred(call) -> TaskDeferred:
    """What ``call()`` deferred with (it must defer)."""
    with pytest.raises(TaskDeferred) as caught:
        call()
    return caught.value


def run_trigger(trigger, timeout_s: float) -> dict:
    """The trigger's first event, running it for real (as the triggerer would), within ``timeout_s``."""

    async def first():
        async for event in trigger.run():
            return event.payload

    return asyncio.run(asyncio.wait_for(first(), timeout=timeout_s))
