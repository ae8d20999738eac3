"""The run contract: command lines, the storage layout, attempt records and the metrics reader."""

import hashlib
import json

import pytest

from trainer.contract import (
    ATTEMPT_FORMAT,
    AttemptRecord,
    MetricsReader,
    MetricsTooLarge,
    RunLayout,
    attempt_of_files_dir,
    attempt_record,
    attempt_record_in_log,
    attempt_record_line,
    check_name,
    checkpoint_step_of,
    dataset_prefix,
    join,
    last_record,
    latest_of_attempt,
    max_step_of_attempt,
    merge_metrics,
    metrics_by_step,
    metrics_part_key,
    metrics_part_name,
    metrics_records,
    metrics_run_uri,
    model_prefix,
    model_version_prefix,
    parse_attempt_record,
    production_pointer,
    run_prefix,
    safe_segment,
    torchrun_argv,
    trainer_argv,
)
from trainer.storage import open_storage


# --- 1. command line ------------------------------------------------------------------------
def test_trainer_argv_is_an_argument_list_with_yaml_spelled_overrides():
    argv = trainer_argv(
        "train",
        "s3://b/runs/r/config.yaml",
        {"train.lr": 0.001, "train.compile": True, "eval.baseline_uri": None},
    )
    assert argv == [
        "python",
        "-m",
        "trainer",
        "train",
        "--config",
        "s3://b/runs/r/config.yaml",
        "train.lr=0.001",
        "train.compile=true",
        "eval.baseline_uri=null",
    ]
    assert trainer_argv("export", "file:///c.yaml", python="/venv/bin/python")[0] == "/venv/bin/python"
    with pytest.raises(
        ValueError, match=r"unknown trainer command 'fit'; expected one of \('train', 'evaluate', 'export'\)"
    ):
        trainer_argv("fit", "file:///c.yaml")


def test_torchrun_argv_wraps_the_trainer_for_a_whole_gang_relaunch():
    trainer = trainer_argv("train", "file:///c.yaml", {"train.lr": 0.1})
    argv = torchrun_argv(
        trainer, nnodes=2, nproc_per_node=8, rdzv_endpoint="head:29500", rdzv_id="r1", shutdown_timeout_s=20
    )
    assert argv == [
        "python",
        "-m",
        "torch.distributed.run",
        "--nnodes=2",
        "--nproc-per-node=8",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=head:29500",
        "--rdzv-id=r1",
        "--shutdown-timeout=20",
        "--max-restarts=0",
        "-m",
        "trainer",
        "train",
        "--config",
        "file:///c.yaml",
        "train.lr=0.1",
    ]
    pinned = torchrun_argv(
        trainer, nnodes=2, nproc_per_node=1, rdzv_endpoint="h:1", rdzv_id="r", node_rank=1, is_host=False
    )
    assert pinned[pinned.index("--max-restarts=0") + 1 : pinned.index("-m", 3)] == [
        "--node-rank=1",
        "--rdzv-conf=is_host=0",
    ]
    with pytest.raises(ValueError, match=r"expected 'python -m trainer ...', got \['python', '-c', 'x'\]"):
        torchrun_argv(["python", "-c", "x"], nnodes=1, nproc_per_node=1, rdzv_endpoint="h:1", rdzv_id="r")


# --- 3. layout --------------------------------------------------------------------------------
def test_segments_are_the_same_on_every_scheme_and_never_empty():
    assert safe_segment("manual__2026-01-01T00:00:00+00:00").startswith("manual__2026-01-01T00_00_00_00_00~")
    assert safe_segment("a/b c") == "a_b_c~" + hashlib.sha256(b"a/b c").hexdigest()[:12]
    with pytest.raises(ValueError, match="must not be empty"):
        safe_segment("")
    assert join("file:///a/", "/b/", "", "c") == "file:///a/b/c"


@pytest.mark.parametrize("name", [".", ".."])
def test_a_segment_that_would_name_its_folder_or_the_parent_is_refused(name):
    with pytest.raises(ValueError) as refused:
        safe_segment(name)
    assert str(refused.value) == (
        f"{name!r} cannot name a dataset, model, run or task: it would point at the folder itself or "
        "its parent; use a name with at least one other character"
    )
    with pytest.raises(ValueError, match="cannot name a dataset"):
        dataset_prefix("file:///root", name, "v1")
    # other names made of dots and slashes stay inside their folder
    assert safe_segment("...") == "..."
    assert safe_segment("../x").startswith(".._x~") and safe_segment("./").startswith("._~")
    assert join("s3://bucket", "x") == "s3://bucket/x"


@pytest.mark.parametrize(
    "names",
    [
        ("nightly:2026-01-01", "nightly_2026-01-01", "nightly/2026-01-01", "nightly 2026-01-01"),
        ("fraud model", "fraud/model", "fraud_model", "fraud~model"),
        ("модель", "данные", "______"),
        ("模型", "数据", "__"),
        ("a" * 300, "a" * 301, "a" * 128, "a" * 129),
        ("x_y~" + "0" * 12, "x_y", "x y", "x~y"),
    ],
)
def test_no_two_names_share_a_segment(names):
    segments = [safe_segment(name) for name in names]
    assert len(set(segments)) == len(names), dict(zip(names, segments, strict=True))
    for segment in segments:  # every one is a plain, bounded path segment
        assert len(segment) <= 128 and "/" not in segment and segment not in (".", "..")


@pytest.mark.parametrize("name", ["fraud_model", "demo-lm", "v1.2", "k=v", "a" * 128])
def test_a_name_that_was_safe_keeps_its_folder(name):
    """Registries and datasets written before the mapping became injective stay where they are."""
    assert safe_segment(name) == name
    assert model_prefix("s3://b/t", name) == f"s3://b/t/models/{name}"


@pytest.mark.parametrize(
    "name", ["demo-lm", "fraud model", "org/model", "модель", "模型", "a" * 128, "x.y=z"]
)
def test_a_model_or_dataset_name_of_any_script_within_the_limit_is_a_name(name):
    assert check_name(name, "model_name") == name


@pytest.mark.parametrize(
    ("name", "words"),
    [
        (
            "a" * 129,
            "'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa'... (129 characters) is 129 characters long; at most 128",
        ),
        ("x" * 300, "is 300 characters long; at most 128 are allowed"),
        ("д" * 129, "is 129 characters long"),
        ("", "model_name '' is empty"),
        ("   ", "model_name '   ' is empty"),
        ("\t\n", "is empty"),
        ("fraud\nmodel", "control character U+000A at position 5"),
        ("fraud\x00", "U+0000 at position 5"),
        ("fraud\u202emodel", "U+202E at position 5"),  # a bidi override: shows as another name
        ("zero\u200bwidth", "U+200B"),
        (
            "fraud ",
            "starts or ends with whitespace, which makes it another name than the one it looks like: use 'fraud'",
        ),
        (" fraud", "use 'fraud'"),
        (".", "is a path step"),
        ("..", "is a path step"),
        (None, "must be a string such as 'demo-lm', got NoneType None"),
        (7, "got int 7"),
    ],
)
def test_a_name_that_is_not_one_is_refused_naming_it_and_what_to_do(name, words):
    with pytest.raises(ValueError) as refused:
        check_name(name, "model_name")
    assert words in str(refused.value)
    assert str(refused.value).startswith("model_name ")


def test_the_longest_name_keeps_every_key_within_what_s3_and_file_systems_take():
    """Whatever the name, its folder is at most 128 ASCII characters, far from a file system's 255
    bytes a segment and S3's 1024 bytes a key (with a 200-character root and a deep file path)."""
    root = "s3://bucket/" + "p" * 200
    for name in ("a" * 128, "д" * 128, "模" * 128, "a b" * 42):
        check_name(name, "model_name")
        segment = safe_segment(name)
        assert len(segment.encode()) <= 128
        key = model_version_prefix(root, name, 10**9)[len("s3://bucket/") :] + "/tokenizer/" + "f" * 200
        assert len(key.encode()) < 1024


def test_prefixes_under_a_root():
    root = "s3://b/trainops"
    assert (
        dataset_prefix(root, "demo data", "v1") == f"s3://b/trainops/datasets/{safe_segment('demo data')}/v1"
    )
    assert model_version_prefix(root, "m", 3) == "s3://b/trainops/models/m/versions/3"
    assert production_pointer(root, "m") == "s3://b/trainops/models/m/production.json"
    assert run_prefix(root, "retrain", "manual__1", "train") == "s3://b/trainops/runs/retrain/manual__1/train"
    assert run_prefix(root, "retrain", "r", "train", map_index=2).endswith("/runs/retrain/r/train.2")
    assert run_prefix(root, "retrain", "r", "train", map_index=-1).endswith("/runs/retrain/r/train")


def test_run_layout_names_every_file_of_a_run():
    layout = RunLayout("file:///runs/r1")
    assert (layout.config, layout.job, layout.metrics, layout.export) == (
        "file:///runs/r1/config.yaml",
        "file:///runs/r1/job.json",
        "file:///runs/r1/metrics.jsonl",
        "file:///runs/r1/export",
    )
    assert layout.attempt(3) == "file:///runs/r1/attempts/3.json"
    assert layout.checkpoint(40) == "file:///runs/r1/checkpoints/step_00000040"
    assert layout.committed_marker(40) == "file:///runs/r1/checkpoints/step_00000040/_COMMITTED"
    assert layout.latest == "file:///runs/r1/checkpoints/latest.json"
    assert (layout.eval_metrics, layout.eval_gate) == (
        "file:///runs/r1/eval/metrics.json",
        "file:///runs/r1/eval/gate.json",
    )
    assert checkpoint_step_of(layout.checkpoint(40) + "/") == 40
    assert checkpoint_step_of(layout.checkpoints) is None
    assert layout.checkpoint_files(40, 3) == "file:///runs/r1/checkpoints/step_00000040/attempt_3"
    assert attempt_of_files_dir("attempt_3") == 3
    assert attempt_of_files_dir("attempt_0") is None and attempt_of_files_dir("attempt_3/x") is None
    with pytest.raises(ValueError, match="attempt numbers start at 1, got 0"):
        layout.checkpoint_files(40, 0)


# --- 4. attempt records ---------------------------------------------------------------------
def test_an_attempt_record_counts_the_steps_the_next_attempt_replays():
    record = attempt_record(
        attempt=2, outcome="preempted", last_step=23, checkpoint_step=20, world_size=4, signal="SIGTERM"
    )
    assert (record["format"], record["steps_lost"], record["signal"], record["resumed_from_step"]) == (
        ATTEMPT_FORMAT,
        3,
        "SIGTERM",
        None,
    )
    assert (
        attempt_record(attempt=1, outcome="failed", last_step=7, checkpoint_step=None, world_size=1)[
            "steps_lost"
        ]
        == 7
    )
    assert parse_attempt_record(record) == record
    with pytest.raises(ValueError, match=r"unknown attempt outcome 'crashed'"):
        attempt_record(attempt=1, outcome="crashed", last_step=0, checkpoint_step=None, world_size=1)


def test_a_failed_record_says_its_cause_and_older_records_without_one_still_parse():
    failed = attempt_record(
        attempt=2, outcome="failed", last_step=30, checkpoint_step=20, world_size=2, cause="storage"
    )
    assert failed["cause"] == "storage" and "metrics_unwritten" not in failed
    assert parse_attempt_record(failed) == failed
    completed = attempt_record(
        attempt=2, outcome="completed", last_step=30, checkpoint_step=30, world_size=2, metrics_unwritten=4
    )
    assert completed["metrics_unwritten"] == 4 and "cause" not in completed
    before = {k: v for k, v in failed.items() if k != "cause"}  # as the previous trainer wrote them
    assert parse_attempt_record(before) == before
    assert set(AttemptRecord.__optional_keys__) == {
        "cause",
        "metrics_unwritten",
        "emergency_save_s",
        "first_step_time",
        "signal_time",
    }
    node = attempt_record(
        attempt=1, outcome="failed", last_step=0, checkpoint_step=None, world_size=2, cause="node"
    )
    assert parse_attempt_record(node)["cause"] == "node"  # a node without the GPUs it was given
    with pytest.raises(ValueError, match=r"unknown failure cause 'disk'"):
        attempt_record(
            attempt=1, outcome="failed", last_step=0, checkpoint_step=None, world_size=1, cause="disk"
        )


def test_a_record_that_storage_refused_travels_in_the_log_and_is_found_again():
    record = attempt_record(
        attempt=3, outcome="failed", last_step=40, checkpoint_step=20, world_size=2, cause="storage"
    )
    line = attempt_record_line(record)
    assert line.startswith("trainops-attempt-record: {") and "\n" not in line
    other = attempt_record_line({**record, "attempt": 2, "cause": "network"})
    tail = "\n".join(
        [
            "[node-0] trainer: failed at step 40: storage refused ...",
            f"[node-0] {other}",
            f"[node-0] {line}",
            "[node-0] trainops-attempt-record: {torn",
            "[node-1] torch.distributed.elastic.multiprocessing.errors.ChildFailedError:",
        ]
    )
    assert attempt_record_in_log(tail, 3) == record  # the last valid one of that attempt
    assert attempt_record_in_log(tail, 2)["cause"] == "network"
    assert attempt_record_in_log(tail, 4) is None and attempt_record_in_log("", 3) is None


def test_rank_0s_final_record_wins_over_an_early_line_printed_after_it():
    # A slower rank's early line (printed at once on an infrastructure failure, before the
    # clean-up) can come after rank 0's complete record: the final one still counts.
    final = attempt_record(
        attempt=1,
        outcome="failed",
        last_step=40,
        checkpoint_step=20,
        world_size=2,
        cause="storage",
        metrics_unwritten=16,
    )
    early = {k: v for k, v in final.items() if k != "metrics_unwritten"}
    early_line = attempt_record_line(early, early=True)
    assert early_line.startswith("trainops-attempt-record-early: {")
    tail = f"[node-0] {attempt_record_line(final)}\n[node-0] {early_line}"
    assert attempt_record_in_log(tail, 1) == final
    # rank 0 stopped before its final line: the early one is all there is, and it is used
    assert attempt_record_in_log(f"[node-0] {early_line}", 1) == early


@pytest.mark.parametrize(
    "change, message",
    [
        ({"format": "other/v1"}, "not a trainops.attempt/v1 record"),
        ({"outcome": "gone"}, "unknown outcome 'gone'"),
        ({"last_step": "7"}, "field 'last_step' must be an integer, got '7'"),
        (
            {"cause": "disk"},
            r"unknown cause 'disk'; expected one of \('storage', 'network', 'node', 'program'\)",
        ),
        ({"metrics_unwritten": -1}, "field 'metrics_unwritten' must be an integer >= 0, got -1"),
    ],
)
def test_a_malformed_attempt_record_is_refused_with_what_is_wrong(change, message):
    record = attempt_record(attempt=1, outcome="completed", last_step=7, checkpoint_step=7, world_size=1)
    with pytest.raises(ValueError, match=message):
        parse_attempt_record({**record, **change})


# --- 5. metrics.jsonl ----------------------------------------------------------------------
TEXT = (
    '{"step": 1, "loss": 5.0, "attempt": 1}\n{"step": 2, "loss": 4.0, "attempt": 1}\n'
    '{"step": 2, "loss": 3.9, "attempt": 2}\nnot json\n{"step": 3, "loss": 3.5, "attempt": 2}\n'
    '["a list"]\n{"step": "5"}\n{"step": 4, "lo'
)  # a torn last line, as a reader may see mid-rewrite


def test_attempts_are_kept_apart_and_garbage_is_skipped():
    records = metrics_records(TEXT)
    assert [(r["step"], r["attempt"]) for r in records] == [(1, 1), (2, 1), (2, 2), (3, 2)]
    assert max_step_of_attempt(records, 1) == 2
    assert max_step_of_attempt(records, 2) == 3
    assert max_step_of_attempt(records, 3) == 0
    assert latest_of_attempt(records, 2)["loss"] == 3.5
    assert latest_of_attempt(records, 9) is None


def test_later_attempt_wins_a_replayed_step():
    by_step = metrics_by_step(metrics_records(TEXT))
    assert sorted(by_step) == [1, 2, 3]
    assert by_step[2]["loss"] == 3.9


def test_the_highest_attempt_wins_even_when_an_older_record_comes_later():
    # an older attempt's record after a newer one's (a late write from a fenced gang) loses
    text = '{"step": 2, "loss": 3.9, "attempt": 2}\n{"step": 2, "loss": 4.0, "attempt": 1}\n'
    assert metrics_by_step(metrics_records(text))[2]["loss"] == 3.9


class Counting:
    """A storage that counts what a reader asks of it (a polling reader must not re-read)."""

    def __init__(self, inner):
        self.inner, self.gets, self.lists = inner, [], 0

    def list(self, prefix_uri):
        self.lists += 1
        return self.inner.list(prefix_uri)

    def get_with_etag(self, uri):
        self.gets.append(uri.rsplit("/", 1)[-1])
        return self.inner.get_with_etag(uri)

    def head(self, uri):
        return self.inner.head(uri)


def put_part(storage, run, attempt, seq, *steps, loss=1.0):
    body = "".join(json.dumps({"step": s, "attempt": attempt, "loss": loss}) + "\n" for s in steps)
    storage.put(RunLayout(run).metrics_part(attempt, seq), body.encode())


def test_metrics_parts_are_named_by_attempt_and_number_and_sort_in_a_listing():
    layout = RunLayout("s3://b/runs/r1")
    assert layout.metrics_part(2, 7) == "s3://b/runs/r1/metrics/part-000002-00000007.jsonl"
    assert metrics_part_key(layout.metrics_part(2, 7)) == (2, 7)
    assert metrics_part_key("s3://b/runs/r1/metrics/notes.txt") is None
    names = [metrics_part_name(a, n) for a, n in ((1, 10), (1, 9), (10, 1), (2, 1))]
    assert [metrics_part_key(n) for n in sorted(names)] == [(1, 9), (1, 10), (2, 1), (10, 1)]
    with pytest.raises(ValueError, match="numbered from 1"):
        metrics_part_name(0, 1)
    # stored trigger arguments name the legacy file: it still leads to the run
    assert metrics_run_uri(layout.metrics) == metrics_run_uri(layout.metrics_parts) == layout.run_uri


def test_merge_replaces_an_attempts_tail_from_a_later_objects_first_step_only():
    legacy = metrics_records(TEXT)  # the previous version's file: (1,1) (2,1) (2,2) (3,2)
    rerun_of_2 = [{"step": 3, "attempt": 2, "loss": 0.3}]  # a rerun of attempt 2 from step 2
    third = [{"step": 3, "attempt": 3, "loss": 0.2}, {"step": 4, "attempt": 3, "loss": 0.1}]
    late_first = [{"step": 9, "attempt": 1, "loss": 9.0}]  # a stale gang, flushing last
    merged = merge_metrics([legacy, rerun_of_2, third, late_first])
    assert [(r["step"], r["attempt"]) for r in merged] == [
        (1, 1),
        (2, 1),
        (9, 1),
        (2, 2),
        (3, 2),
        (3, 3),
        (4, 3),
    ]
    assert [r["loss"] for r in merged if r["attempt"] == 2] == [3.9, 0.3]
    assert merge_metrics([third, third]) == third  # a part read twice counts once
    assert last_record(merged) == {"step": 9, "attempt": 1, "loss": 9.0}
    assert last_record([{"step": 4, "attempt": 2}, {"step": 4, "attempt": 3}]) == {"step": 4, "attempt": 3}
    assert last_record([]) is None


def test_the_reader_merges_parts_with_the_legacy_file_and_reads_each_part_once(tmp_path):
    run = (tmp_path / "run").as_uri()
    store = open_storage(run)
    store.put(RunLayout(run).metrics, TEXT.encode())  # written by the previous version
    storage = Counting(store)
    reader = MetricsReader(storage, run)
    assert [(r["step"], r["attempt"]) for r in reader.records()] == [(1, 1), (2, 1), (2, 2), (3, 2)]
    put_part(store, run, 3, 1, 3, 4)
    put_part(store, run, 3, 2, 5)
    assert max(metrics_by_step(reader.records())) == 5
    assert storage.gets == ["metrics.jsonl", "part-000003-00000001.jsonl", "part-000003-00000002.jsonl"]
    put_part(store, run, 3, 3, 6)
    assert [r["step"] for r in reader.records() if r["attempt"] == 3] == [3, 4, 5, 6]
    assert storage.gets[3:] == ["part-000003-00000003.jsonl"]  # only what is new, no legacy re-read
    assert reader.records() and storage.gets[4:] == []
    assert reader.found and not MetricsReader(storage, (tmp_path / "none").as_uri()).found


def test_latest_reads_only_each_attempts_newest_part(s3_root):
    run = f"{s3_root}/run"
    store = open_storage(run)
    for seq in range(1, 6):
        put_part(store, run, 1, seq, seq * 10)
    put_part(store, run, 2, 1, 30, 31)
    storage = Counting(store)
    reader = MetricsReader(storage, run)
    latest = reader.latest()
    assert {a: r["step"] for a, r in latest.items()} == {1: 50, 2: 31}
    assert sorted(storage.gets) == ["part-000001-00000005.jsonl", "part-000002-00000001.jsonl"]
    assert last_record(latest.values())["step"] == 50
    put_part(store, run, 2, 2, 32)
    follow = MetricsReader(storage, run, attempt=2)  # the trigger's: one attempt only
    assert follow.latest()[2]["step"] == 32 and 1 not in follow.latest()
    assert storage.gets[2:] == ["part-000002-00000002.jsonl"]


def test_the_readers_byte_cap_and_check_hold_for_parts_and_the_legacy_file(tmp_path):
    run = (tmp_path / "run").as_uri()
    store = open_storage(run)
    for seq in range(1, 4):
        put_part(store, run, 1, seq, seq)
    size = len(store.get(RunLayout(run).metrics_part(1, 1)))
    assert len(MetricsReader(store, run, max_bytes=3 * size).records()) == 3
    with pytest.raises(MetricsTooLarge, match="more than the"):
        MetricsReader(store, run, max_bytes=3 * size - 1).records()
    legacy_only = (tmp_path / "old").as_uri()
    store.put(RunLayout(legacy_only).metrics, TEXT.encode())
    with pytest.raises(MetricsTooLarge, match=f"{len(TEXT) - 1} bytes"):
        MetricsReader(store, legacy_only, max_bytes=len(TEXT) - 1).records()
    store.put(RunLayout(run).metrics, TEXT.encode())
    seen = []
    MetricsReader(store, run, check=seen.append).records()
    assert [u.rsplit("/", 1)[-1] for u in seen] == [
        "metrics.jsonl",
        *(metrics_part_name(1, n) for n in (1, 2, 3)),
    ]


def test_an_emergency_save_duration_travels_in_the_record_and_is_checked():
    from trainer.contract import attempt_record, parse_attempt_record

    rec = attempt_record(
        attempt=1, outcome="preempted", last_step=5, checkpoint_step=5, world_size=2, emergency_save_s=12.5
    )
    assert parse_attempt_record(rec)["emergency_save_s"] == 12.5
    assert "emergency_save_s" not in attempt_record(
        attempt=1, outcome="completed", last_step=5, checkpoint_step=5, world_size=2
    )
    with pytest.raises(ValueError, match="'emergency_save_s' must be a number of seconds >= 0, got 'x'"):
        parse_attempt_record({**rec, "emergency_save_s": "x"})


def test_the_first_step_and_signal_times_travel_in_the_record_and_are_checked():
    from trainer.contract import attempt_record, parse_attempt_record

    rec = attempt_record(
        attempt=1,
        outcome="preempted",
        last_step=5,
        checkpoint_step=5,
        world_size=2,
        first_step_time=1767225690.25,
        signal_time=1767225752.5,
    )
    assert (rec["first_step_time"], rec["signal_time"]) == (1767225690.25, 1767225752.5)
    assert parse_attempt_record(rec) == rec
    older = attempt_record(attempt=1, outcome="completed", last_step=5, checkpoint_step=5, world_size=2)
    assert "first_step_time" not in older and "signal_time" not in older  # and still read
    assert parse_attempt_record(older) == older
    for key in ("first_step_time", "signal_time"):
        with pytest.raises(ValueError, match=f"'{key}' must be epoch seconds"):
            parse_attempt_record({**rec, key: "noon"})


def test_a_heartbeat_is_read_back_and_a_damaged_one_is_none():
    from trainer.contract import parse_heartbeat

    layout = RunLayout("s3://b/runs/d/r/t")
    assert layout.heartbeat(2) == "s3://b/runs/d/r/t/heartbeat/2.json"
    beat = {"attempt": 2, "step": 7, "time": 1.5, "steps": 3, "median_step_s": None}
    assert parse_heartbeat(beat) == beat
    assert parse_heartbeat({**beat, "median_step_s": "0.5"})["median_step_s"] == 0.5
    assert parse_heartbeat({"step": 1}) is None and parse_heartbeat([1]) is None
    assert parse_heartbeat({**beat, "step": "x"}) is None
