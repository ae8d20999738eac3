"""The notice watcher: its settings, the provider it finds, each notice handed on once, and
its own errors never reaching training."""

import logging
import re
import threading
import time

import pytest

from tests.trainer.runtime.metadata_server import MetadataServer
from trainer.runtime.notice import NoticeWatcher, detect, notice_record, settings_from, watch
from trainer.runtime.notice_sources import Notice
from trainer.runtime.preemption import NOTICE, StopFlag


def test_settings_default_to_off_and_a_bad_value_names_itself():
    assert settings_from({}) == ("off", None, 2.0)
    assert settings_from({"TRAINOPS_SPOT_NOTICE": "AWS", "TRAINOPS_METADATA_URL": "http://127.0.0.1:9"})[
        :2
    ] == (
        "aws",
        "http://127.0.0.1:9",
    )
    with pytest.raises(
        ValueError, match="TRAINOPS_SPOT_NOTICE='ec2' is not one of off, auto, aws, gce, azure"
    ):
        settings_from({"TRAINOPS_SPOT_NOTICE": "ec2"})
    with pytest.raises(ValueError, match=re.escape("TRAINOPS_METADATA_URL='169.254.169.254' is not an http")):
        settings_from({"TRAINOPS_SPOT_NOTICE": "aws", "TRAINOPS_METADATA_URL": "169.254.169.254"})
    with pytest.raises(ValueError, match="TRAINOPS_SPOT_NOTICE_EVERY_S='0'"):
        settings_from({"TRAINOPS_SPOT_NOTICE_EVERY_S": "0"})


@pytest.mark.parametrize("shape", ["aws", "gce", "azure"])
def test_auto_finds_the_provider_that_answers(shape):
    fake = MetadataServer(shape)
    try:
        found = detect(fake.url)
        assert found is not None and found.provider == shape
    finally:
        fake.close()


def test_auto_with_no_endpoint_watches_nothing_and_says_so(caplog):
    caplog.set_level(logging.INFO, logger="trainer.notice")
    watcher = NoticeWatcher("auto", "http://127.0.0.1:9", 0.05, lambda n: None).start()
    watcher._thread.join(timeout=10)
    assert not watcher._thread.is_alive() and watcher.source is None
    assert "no metadata endpoint answered (aws, gce, azure); SIGTERM alone stops training" in caplog.text


def test_only_each_nodes_local_rank_0_watches_and_off_watches_nothing():
    env = {"TRAINOPS_SPOT_NOTICE": "gce", "TRAINOPS_METADATA_URL": "http://127.0.0.1:9"}
    assert watch(env, 1, lambda n: None) is None
    assert watch({}, 0, lambda n: None) is None
    with pytest.raises(ValueError):  # a bad value fails on every rank, watcher or not
        watch({"TRAINOPS_SPOT_NOTICE": "yes"}, 1, lambda n: None)


def test_a_notice_reaches_the_stop_flag_once_through_errors_and_hangs(caplog):
    caplog.set_level(logging.INFO, logger="trainer.notice")
    fake = MetadataServer("aws")
    flag = StopFlag()
    seen: list[Notice] = []
    arrived = threading.Event()

    def on_notice(notice: Notice) -> None:
        seen.append(notice)
        flag.on_notice(notice)
        arrived.set()

    try:
        fake.fail_next(3, status=503)
        fake.hang_next(1)
        watcher = NoticeWatcher("aws", fake.url, 0.05, on_notice, node="ip-10-0-1-7.ec2.internal").start()
        deadline = time.monotonic() + 20
        while watcher.polls < 2:
            assert time.monotonic() < deadline, "the watcher never read the endpoint after its errors"
            time.sleep(0.02)
        assert not flag.is_set
        fake.announce(time.time() + 120)
        assert arrived.wait(10)
        time.sleep(0.3)  # several more polls of the same notice
        watcher.close()
    finally:
        fake.close()
    assert len(seen) == 1  # once, though every later poll still read it
    assert seen[0].node == "ip-10-0-1-7.ec2.internal"  # the Node the downward API named
    assert (flag.signal_name, flag.notice) == (NOTICE, seen[0]) and flag.at is not None
    # the errors were said once, and the recovery once
    assert caplog.text.count("metadata could not be read") == 1
    assert caplog.text.count("metadata answers again") == 1


def test_a_failing_callback_never_stops_the_watcher(caplog):
    fake = MetadataServer("gce")
    calls = []

    def broken(notice: Notice) -> None:
        calls.append(notice)
        raise RuntimeError("boom")

    try:
        fake.announce(time.time() + 30)
        fake.advise()
        watcher = NoticeWatcher("gce", fake.url, 0.05, broken)
        watcher.source = watcher._source()
        assert len(watcher.poll_once()) == 2
        assert watcher.poll_once() == []
    finally:
        fake.close()
    assert len(calls) == 2 and "acting on gce" in caplog.text


def test_the_record_says_the_lead_and_when_the_save_committed():
    notice = Notice(
        "azure", "interruption", "scheduledevents: Preempt F1A3", 1000.0, 1030.0, "aks-gpu-vmss000001"
    )
    assert notice_record(notice, saved_at=1004.25) == {
        "provider": "azure",
        "event": "scheduledevents: Preempt F1A3",
        "noticed_at": 1000.0,
        "deadline": 1030.0,
        "lead_s": 30.0,
        "saved_at": 1004.25,
        "saved_after_s": 4.25,
        "node": "aks-gpu-vmss000001",  # the next attempt keeps off it (trainops.recovery.bad_nodes)
        "nodes": ["aks-gpu-vmss000001"],
    }
    both = notice_record(notice, saved_at=1004.25, nodes=["aks-gpu-vmss000001", "aks-gpu-vmss000002"])
    assert both["nodes"] == ["aks-gpu-vmss000001", "aks-gpu-vmss000002"]  # every node that read one
