"""Preemption: a signal only sets a flag, and any rank's flag stops every rank."""

import os
import signal
import time

from trainer.runtime.notice_sources import Notice
from trainer.runtime.preemption import NOTICE, StopFlag, stop_cause, stop_decision


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


def test_an_interruption_notice_stops_like_a_signal_and_an_advisory_asks_for_one_save():
    flag = StopFlag()
    flag.on_notice(Notice("aws", "advisory", "rebalance recommendation", 1.0))
    assert not flag.is_set
    assert flag.take_save_request() is True
    assert flag.take_save_request() is False  # one save per advisory
    notice = Notice("aws", "interruption", "spot/instance-action: terminate", 2.0, 122.0)
    flag.on_notice(notice)
    assert (flag.is_set, flag.signal_name, flag.notice) == (True, NOTICE, notice)
    flag.on_notice(Notice("aws", "interruption", "spot/instance-action: stop", 3.0))
    assert flag.notice is notice  # the first one stopped it


def test_a_signal_before_the_notice_keeps_its_name():
    flag = StopFlag()
    flag._handle(signal.SIGTERM, None)
    flag.on_notice(Notice("gce", "interruption", "instance/preempted: TRUE", 5.0, 35.0))
    assert (flag.signal_name, flag.notice) == ("SIGTERM", None)


def test_the_stop_cause_is_the_first_ranks_signal_and_the_earliest_notice():
    early = Notice("gce", "interruption", "instance/preempted: TRUE", 5.0, 35.0)
    late = Notice("gce", "interruption", "instance/preempted: TRUE", 7.0, 37.0)
    # rank 0 saw nothing; the nodes of ranks 2 and 4 read the notice
    assert stop_cause([(None, None), (None, None), (NOTICE, late), (None, None), (NOTICE, early)]) == (
        NOTICE,
        early,
    )
    assert stop_cause([("SIGTERM", None), (NOTICE, early)]) == ("SIGTERM", early)
    assert stop_cause([(None, None), (None, None)]) == ("SIGTERM", None)
