"""Preemption: a signal only sets a flag, and any rank's flag stops every rank."""

import os
import signal
import time

from trainer.runtime.preemption import StopFlag, stop_decision


def test_any_rank_signal_stops_all():
    assert stop_decision(0.0, None) == (False, None)
    assert stop_decision(1.0, None) == (True, "SIGTERM")  # this rank saw nothing; a peer did
    assert stop_decision(2.0, "SIGINT") == (True, "SIGINT")


def test_a_signal_only_sets_the_flag_and_the_first_one_is_remembered():
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        flag = StopFlag().install()
        assert (flag.is_set, flag.signal_name) == (False, None)
        os.kill(os.getpid(), signal.SIGTERM)  # the process lives on: the handler only records it
        assert (flag.is_set, flag.signal_name) == (True, "SIGTERM")
        assert flag.at is not None and flag.at <= time.monotonic()  # the notice window's start
        os.kill(os.getpid(), signal.SIGINT)
        assert flag.signal_name == "SIGTERM"
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
