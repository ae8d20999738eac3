"""The pure half of the Kubernetes log stream: timestamps, dedupe against the cursor, capping."""

import json

import pytest

from trainops.cluster.kubernetes.logs import (
    new_lines,
    not_started,
    since_seconds,
    split_timestamp,
    timestamp_key,
)

POD = "train-5f1c2a9e-a1-0-k7q2m"


def read(*entries, end="\n"):
    """A ``timestamps=True`` read of (timestamp, text) entries."""
    return "".join(f"{ts} {text}\n" for ts, text in entries)[:-1] + end


def test_timestamps_order_by_time_not_by_string():
    # Go's RFC3339Nano drops trailing zeros: as strings "…:02Z" > "…:02.5Z" > "…:02.12Z"
    keys = [
        timestamp_key(t)
        for t in (
            "2026-01-01T10:00:02Z",
            "2026-01-01T10:00:02.12Z",
            "2026-01-01T10:00:02.5Z",
            "2026-01-01T10:00:02.500000001Z",
            "2026-01-01T11:00:03+01:00",
        )
    ]
    assert keys == sorted(keys) and keys[0][1] == 0 and keys[1][1] == 120_000_000
    assert keys[-1][0] == keys[0][0] + 1  # the offset is honoured
    assert timestamp_key("step 1") is None and timestamp_key(None) is None
    assert split_timestamp("2026-01-01T10:00:02.5Z loss 0.5 x") == ("2026-01-01T10:00:02.5Z", "loss 0.5 x")
    assert split_timestamp("no timestamp here") == (None, "no timestamp here")


def test_since_seconds_covers_the_cursor_and_is_at_least_one():
    t = timestamp_key("2026-01-01T10:00:02.5Z")[0] + 0.5
    assert since_seconds("2026-01-01T10:00:02.5Z", now=t + 7.2) == 9  # ceil(7.2) + 1
    assert since_seconds("2026-01-01T10:00:02.5Z", now=t + 7) == 8
    assert since_seconds("2026-01-01T10:00:02.5Z", now=t - 30) == 1  # clocks disagree
    with pytest.raises(ValueError, match="log cursor timestamp 'yesterday' is not RFC 3339"):
        since_seconds("yesterday", now=t)


def test_a_first_read_returns_all_lines_without_timestamps_and_a_json_cursor():
    lines, cursor = new_lines(
        read(
            ("2026-01-01T10:00:01Z", "start"),
            ("2026-01-01T10:00:02Z", "step 1"),
            ("2026-01-01T10:00:02Z", ""),  # an empty line is a line
            ("2026-01-01T10:00:02.5Z", "step 2"),
        ),
        None,
        POD,
        10,
        tailed=True,
    )
    assert lines == ["start", "step 1", "", "step 2"]
    assert cursor == {"pod": POD, "ts": "2026-01-01T10:00:02.5Z", "n": 1}
    assert json.loads(json.dumps(cursor)) == cursor


def test_lines_the_cursor_saw_are_dropped_even_with_equal_timestamps():
    cursor = {"pod": POD, "ts": "2026-01-01T10:00:02Z", "n": 2}
    text = read(
        ("2026-01-01T10:00:01Z", "start"),  # before the cursor
        ("2026-01-01T10:00:02Z", "a"),
        ("2026-01-01T10:00:02Z", "b"),  # seen
        ("2026-01-01T10:00:02Z", "c"),  # same timestamp, not seen
        ("2026-01-01T10:00:02.25Z", "d"),
    )
    lines, after = new_lines(text, cursor, POD, 10)
    assert lines == ["c", "d"]
    assert after == {"pod": POD, "ts": "2026-01-01T10:00:02.25Z", "n": 1}
    lines, again = new_lines(text, after, POD, 10)  # the same read once more: nothing new
    assert (lines, again) == ([], after)
    _, same_ts = new_lines(
        read(("2026-01-01T10:00:02Z", "a"), ("2026-01-01T10:00:02Z", "b"), ("2026-01-01T10:00:02Z", "c")),
        cursor,
        POD,
        10,
    )
    assert same_ts == {"pod": POD, "ts": "2026-01-01T10:00:02Z", "n": 3}  # counts all three


def test_another_pods_cursor_counts_as_none():
    old = {"pod": "train-5f1c2a9e-a1-0-old", "ts": "2026-01-01T11:00:00Z", "n": 4}
    lines, cursor = new_lines(read(("2026-01-01T10:00:01Z", "fresh pod")), old, POD, 10, tailed=True)
    assert lines == ["fresh pod"] and cursor["pod"] == POD and cursor["n"] == 1


def test_more_lines_than_fit_leave_a_notice_and_the_newest():
    entries = [(f"2026-01-01T10:00:{i // 10:02d}.{i % 10}Z", f"step {i}") for i in range(50)]
    cursor = {"pod": POD, "ts": entries[4][0], "n": 1}
    lines, after = new_lines(read(*entries), cursor, POD, 10)
    assert lines == ["(… 36 earlier lines skipped)"] + [f"step {i}" for i in range(41, 50)]
    assert after["ts"] == entries[-1][0]
    first, _ = new_lines(read(*entries[-11:]), None, POD, 10, tailed=True)  # tail of 11
    assert first == ["(… earlier lines skipped)"] + [f"step {i}" for i in range(41, 50)]
    assert new_lines(read(*entries[-10:]), None, POD, 10, tailed=True)[0][0] == "step 40"


def test_a_tail_past_the_cursor_says_lines_may_be_missing_unless_it_overlaps():
    cursor = {"pod": POD, "ts": "2026-01-01T10:00:01Z", "n": 1}
    gap, _ = new_lines(
        read(("2026-01-01T10:00:05Z", "x"), ("2026-01-01T10:00:06Z", "y")), cursor, POD, 10, tailed=True
    )
    assert gap == ["(… earlier lines skipped)", "x", "y"]
    overlap, _ = new_lines(
        read(("2026-01-01T10:00:01Z", "seen"), ("2026-01-01T10:00:06Z", "y")), cursor, POD, 10, tailed=True
    )
    assert overlap == ["y"]
    many = {"pod": POD, "ts": "2026-01-01T10:00:01Z", "n": 7}
    assert new_lines(
        read(("2026-01-01T10:00:01Z", "g"), ("2026-01-01T10:00:01Z", "h")), many, POD, 10, tailed=True
    ) == ([], many)  # 2 of the 7 seen: still 7


def test_a_partial_last_line_waits_unless_the_log_is_complete():
    text = read(("2026-01-01T10:00:01Z", "done"), ("2026-01-01T10:00:02Z", "half a li"), end="")
    lines, cursor = new_lines(text, None, POD, 10, keep_partial=False)
    assert lines == ["done"] and cursor["ts"] == "2026-01-01T10:00:01Z"
    assert new_lines(text, None, POD, 10)[0] == ["done", "half a li"]


def test_nothing_new_keeps_the_cursor():
    cursor = {"pod": POD, "ts": "2026-01-01T10:00:02Z", "n": 1}
    assert new_lines("", cursor, POD, 10) == ([], cursor)
    assert new_lines("", None, POD, 10) == ([], {"pod": POD, "ts": None, "n": 0})


def test_not_started_is_the_400_of_a_waiting_container():
    waiting = 'container "trainer" in pod "p" is waiting to start: ContainerCreating'
    assert not_started(400, waiting)
    assert not_started(400, 'container "trainer" in pod "p" is waiting to start: PodInitializing')
    assert not not_started(400, 'container "sidecar" is not valid for pod "p"')
    assert not not_started(500, waiting)
