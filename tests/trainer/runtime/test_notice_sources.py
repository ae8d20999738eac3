"""The clouds' notices as each endpoint serves them, over HTTP against a fake endpoint that
refuses what the real one refuses (tests/trainer/runtime/metadata_server.py)."""

import time

import pytest

from tests.trainer.runtime.metadata_server import VM_NAME, MetadataServer
from trainer.runtime.notice_sources import (
    GCE_PREEMPTION_NOTICE_S,
    MetadataError,
    parse_aws_instance_action,
    parse_azure_events,
    parse_gce_maintenance,
    parse_gce_preempted,
    source_for,
)


@pytest.fixture(params=["aws", "gce", "azure"])
def server(request):
    fake = MetadataServer(request.param)
    yield fake
    fake.close()


def test_no_notice_until_the_cloud_announces_one_then_its_deadline(server):
    source = source_for(server.shape, server.url)
    source.probe()
    now = time.time()
    assert source.poll(now) == []
    server.announce(now + 10)
    (notice,) = source.poll(now)
    assert (notice.provider, notice.kind, notice.noticed_at) == (server.shape, "interruption", now)
    if server.shape == "gce":  # GCE announces no deadline: its documented 30 s
        assert notice.lead_s == GCE_PREEMPTION_NOTICE_S
    else:  # the announced time, to the second
        assert 9 <= notice.lead_s <= 10
    assert server.refused == 0  # every read carried the provider's header or token


def test_the_advisories_ask_for_a_save_only():
    for shape, event in (("aws", "rebalance recommendation"), ("gce", "TERMINATE_ON_HOST_MAINTENANCE")):
        fake = MetadataServer(shape)
        try:
            fake.advise()
            (notice,) = source_for(shape, fake.url).poll(time.time())
            assert notice.kind == "advisory" and event in notice.event
        finally:
            fake.close()


def test_aws_asks_for_a_new_token_after_a_refusal():
    fake = MetadataServer("aws")
    try:
        source = source_for("aws", fake.url)
        source.poll(time.time())
        fake.fail_next(1, status=401)  # the token expired
        with pytest.raises(MetadataError, match="HTTP 401"):
            source.poll(time.time())
        fake.announce(time.time() + 120)
        (notice,) = source.poll(time.time())
        assert notice.event == "spot/instance-action: terminate"
    finally:
        fake.close()


def test_a_provider_probe_fails_on_another_providers_endpoint():
    fake = MetadataServer("gce")
    try:
        with pytest.raises(MetadataError):
            source_for("aws", fake.url).probe()
        with pytest.raises(MetadataError):
            source_for("azure", fake.url).probe()
        source_for("gce", fake.url).probe()
    finally:
        fake.close()


def test_an_endpoint_that_hangs_is_an_error_within_the_timeout():
    fake = MetadataServer("gce")
    try:
        fake.hang_next(1)
        started = time.monotonic()
        with pytest.raises(MetadataError, match="timed out"):
            source_for("gce", fake.url).poll(time.time())
        assert time.monotonic() - started < 2.5
    finally:
        fake.close()


def test_azure_takes_only_events_that_name_this_vm():
    body = (
        b'{"Events": [{"EventType": "Preempt", "Resources": ["other"], "NotBefore": "Sun, 06 Dec 2026 05:00:30 GMT"},'
        b' {"EventType": "Freeze", "Resources": ["%s"]},'
        b' {"EventId": "E1", "EventType": "Terminate", "Resources": ["%s"], "NotBefore": ""}]}'
        % (VM_NAME.encode(), VM_NAME.encode())
    )
    (notice,) = parse_azure_events(body, 100.0, VM_NAME)
    assert notice.event == "scheduledevents: Terminate E1" and notice.deadline is None
    assert len(parse_azure_events(body, 100.0, None)) == 2  # name unknown: every ending event


@pytest.mark.parametrize(
    "body",
    [b"<html>not json</html>", b'{"Events": "none"}'],
)
def test_a_damaged_azure_answer_is_an_error_not_a_notice(body):
    with pytest.raises(MetadataError, match="scheduledevents"):
        parse_azure_events(body, 0.0, None)


def test_the_pure_parsers():
    assert parse_aws_instance_action(404, b"", 0.0) is None
    stop = parse_aws_instance_action(200, b'{"action": "stop", "time": "2026-12-06T05:02:00Z"}', 0.0)
    assert stop is not None and stop.event == "spot/instance-action: stop" and stop.deadline == 1796533320.0
    with pytest.raises(MetadataError, match="without an action"):
        parse_aws_instance_action(200, b"{}", 0.0)
    assert parse_gce_preempted(b"FALSE", 0.0) is None
    assert parse_gce_maintenance(b"NONE", 0.0) is None
    migrate = parse_gce_maintenance(b"MIGRATE_ON_HOST_MAINTENANCE", 0.0)
    assert migrate is not None and migrate.kind == "advisory"
