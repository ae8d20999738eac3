"""Names to folders and keys (``trainer.contract.layout``)."""

import hashlib

import pytest

from trainer.contract import (
    RunLayout,
    attempt_of_files_dir,
    check_name,
    checkpoint_step_of,
    dataset_prefix,
    join,
    model_prefix,
    model_version_prefix,
    production_pointer,
    prune_plan,
    run_prefix,
    safe_segment,
    scheduled_for_eval,
)


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


def test_prune_keeps_the_newest_k_committed():
    assert prune_plan([10, 20, 30, 40], committed={10, 20, 30, 40}, keep=2, just_committed=40) == [10, 20]


def test_prune_removes_interrupted_saves_older_than_the_new_commit_only():
    # 25: an interrupted save before 30 was committed; 50: newer, not ours to judge.
    assert prune_plan([10, 20, 25, 30, 50], committed={10, 20, 30}, keep=2, just_committed=30) == [10, 25]


def test_prune_keeps_held_checkpoints_beside_the_newest_k():
    # 20 awaits its mid-run evaluation: kept, and not counted towards keep; 15 (held but never
    # committed: an interrupted save) goes.
    plan = prune_plan(
        [10, 15, 20, 30, 40], committed={10, 20, 30, 40}, keep=2, just_committed=40, held=frozenset({15, 20})
    )
    assert plan == [10, 15]


def test_prune_never_deletes_the_one_just_committed():
    # Even when a newer commit exists (a run restarted with resume=never), the new one stays.
    assert prune_plan([10, 20, 90], committed={10, 20, 90}, keep=1, just_committed=20) == [10]
    with pytest.raises(ValueError, match=r"checkpoint.keep must be at least 1, got 0"):
        prune_plan([10], committed={10}, keep=0, just_committed=10)


def test_checkpoints_scheduled_for_mid_run_evaluation_are_every_nth_regular_one():
    # every 25 steps, every 2nd checkpoint: 50, 100, ...; an emergency save (60) never is
    assert [s for s in range(1, 201) if scheduled_for_eval(s, 25, 2)] == [50, 100, 150, 200]
    assert not any(scheduled_for_eval(s, 25, 0) for s in range(1, 201))  # 0: off
    layout = RunLayout("file:///r/run")
    assert layout.checkpoint_score(50) == "file:///r/run/eval/checkpoints/step_00000050.json"
    assert layout.checkpoint_export(50) == "file:///r/run/eval/checkpoints/step_00000050/export"
