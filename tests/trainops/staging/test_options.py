import re

import pytest

from trainops.staging.options import check_dataset_name, check_options, check_quarantine, check_tokenizer

GOOD = {"eval_percent": 10, "shard_tokens": 4096, "slice_columns": ["source"]}


@pytest.mark.parametrize(
    "options",
    [
        GOOD,
        {**GOOD, "eval_percent": 1},
        {**GOOD, "eval_percent": 50, "shard_tokens": 1},
        {**GOOD, "slice_columns": ()},
    ],
)
def test_good_split_shard_and_slice_options_pass(options):
    check_options(**options)  # raises for a bad value; nothing to return


@pytest.mark.parametrize(
    "change, message",
    [
        ({"eval_percent": 0}, "eval_percent must be an integer from 1 to 50, got 0"),
        ({"eval_percent": 51}, "eval_percent must be an integer from 1 to 50, got 51"),
        ({"eval_percent": 10.0}, "eval_percent must be an integer from 1 to 50, got 10.0"),
        ({"eval_percent": "10"}, "eval_percent must be an integer from 1 to 50, got '10'"),
        ({"eval_percent": True}, "eval_percent must be an integer from 1 to 50, got True"),
        ({"shard_tokens": 0}, "shard_tokens must be a positive integer, got 0"),
        ({"shard_tokens": False}, "shard_tokens must be a positive integer, got False"),
        ({"shard_tokens": 1e6}, "shard_tokens must be a positive integer, got 1000000.0"),
        (
            {"slice_columns": "source"},
            "slice_columns must be a list of column names, got the string 'source'",
        ),
        (
            {"slice_columns": ["source", "id"]},
            "slice column 'id' is not allowed: use a column name other than id, start, end",
        ),
        ({"slice_columns": ["end"]}, "slice column 'end' is not allowed"),
        ({"slice_columns": [3]}, "slice column 3 is not allowed"),
    ],
)
def test_bad_options_name_the_value(change, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        check_options(**{**GOOD, **change})


@pytest.mark.parametrize(
    "quarantine, checked",
    [
        (None, None),
        ({"max_fraction": 0.25, "sample_rows": 0}, {"max_fraction": 0.25, "sample_rows": 0}),
    ],
)
def test_quarantine_is_off_or_a_limit_with_a_sample_size(quarantine, checked):
    assert check_quarantine(quarantine) == checked


def test_quarantine_options_are_checked():
    assert check_quarantine({"max_fraction": 0}) == {"max_fraction": 0.0, "sample_rows": 100}
    with pytest.raises(ValueError, match="needs 'max_fraction'"):
        check_quarantine({"sample_rows": 3})
    with pytest.raises(ValueError, match="sample_rows must be a non-negative integer"):
        check_quarantine({"max_fraction": 0.1, "sample_rows": -1})


@pytest.mark.parametrize(
    "quarantine, message",
    [
        (0.01, "quarantine must be None or a dict such as {'max_fraction': 0.01}, got 0.01"),
        (
            {"max_fraction": 0.1, "rows": 3},
            "quarantine has unknown keys ['rows']: use 'max_fraction' and 'sample_rows'",
        ),
        (
            {"max_fraction": 1},
            "quarantine max_fraction must be a number from 0 up to (not including) 1, got 1",
        ),
        (
            {"max_fraction": -0.1},
            "quarantine max_fraction must be a number from 0 up to (not including) 1, got -0.1",
        ),
        ({"max_fraction": True}, "got True"),
        ({"max_fraction": "1%"}, "got '1%'"),
        (
            {"max_fraction": 0.1, "sample_rows": 2.5},
            "quarantine sample_rows must be a non-negative integer, got 2.5",
        ),
    ],
)
def test_bad_quarantine_options_name_the_value(quarantine, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        check_quarantine(quarantine)


@pytest.mark.parametrize(
    "tokenizer, checked",
    [
        (None, {"kind": "byte"}),
        ("byte", {"kind": "byte"}),
        (
            "s3://b/tok/tokenizer.json",
            {"kind": "huggingface", "uri": "s3://b/tok/tokenizer.json", "eos_token": None},
        ),
        (
            {"uri": "file:///models/tokenizer.json", "eos_token": "<|endoftext|>"},
            {"kind": "huggingface", "uri": "file:///models/tokenizer.json", "eos_token": "<|endoftext|>"},
        ),
    ],
)
def test_the_tokenizer_is_the_byte_one_or_a_hugging_face_file(tokenizer, checked):
    assert check_tokenizer(tokenizer) == checked


@pytest.mark.parametrize(
    "tokenizer, message",
    [
        (42, "tokenizer must be None, 'byte', a tokenizer.json URI or a dict, got 42"),
        (
            {"uri": "s3://b/t.json", "eos": "</s>"},
            "tokenizer has unknown keys ['eos']: use 'uri' and 'eos_token'",
        ),
        ("gpt2", "tokenizer uri must be a file:// or s3:// URI of a Hugging Face tokenizer.json, got 'gpt2'"),
        (
            {"eos_token": "</s>"},
            "tokenizer uri must be a file:// or s3:// URI of a Hugging Face tokenizer.json, got None",
        ),
        ("https://hf.co/t.json", "got 'https://hf.co/t.json'"),
        ({"uri": "s3://b/t.json", "eos_token": ""}, "tokenizer eos_token must be a non-empty string, got ''"),
        ({"uri": "s3://b/t.json", "eos_token": 2}, "tokenizer eos_token must be a non-empty string, got 2"),
    ],
)
def test_bad_tokenizers_name_the_value(tokenizer, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        check_tokenizer(tokenizer)


@pytest.mark.parametrize(
    "name", ["demo", "support-tickets", "tickets_2026.v2", ".hidden", "a b", "данные", "d" * 128]
)
def test_a_dataset_name_is_one_folder(name):
    assert check_dataset_name(name) == name


@pytest.mark.parametrize(
    "name, words",
    [
        ("d" * 300, "is 300 characters long; at most 128 are allowed"),
        ("tickets\n", "holds the invisible or control character U+000A at position 7"),
        (
            "tickets ",
            "starts or ends with whitespace, which makes it another name than the one it looks like: use 'tickets'",
        ),
    ],
)
def test_a_dataset_name_follows_the_one_rule_for_names(name, words):
    """The same check as a model name's (trainer.contract.check_name), before anything is staged."""
    with pytest.raises(ValueError) as refused:
        check_dataset_name(name)
    assert str(refused.value).startswith("dataset_name ") and words in str(refused.value)


@pytest.mark.parametrize(
    "name, message",
    [
        (
            "..",
            "dataset_name '..' is a path step, not a name (it would be stored outside datasets/): give the dataset a name such as 'demo'",
        ),
        (
            ".",
            "dataset_name '.' is a path step, not a name (it would be stored outside datasets/): give the dataset a name such as 'demo'",
        ),
        ("", "dataset_name '' is empty: give the dataset a name such as 'demo'"),
        ("  ", "dataset_name '  ' is empty: give the dataset a name such as 'demo'"),
        (
            "team/tickets",
            "dataset_name 'team/tickets' holds a path separator, but a dataset name is one folder under datasets/: use '-' instead, such as 'team-tickets'",
        ),
        (
            "../x",
            "dataset_name '../x' holds a path separator, but a dataset name is one folder under datasets/: use '-' instead, such as '..-x'",
        ),
        (None, "dataset_name must be a string such as 'demo', got None"),
    ],
)
def test_a_dataset_name_that_is_not_one_folder_is_refused(name, message):
    with pytest.raises(ValueError) as err:
        check_dataset_name(name)
    assert str(err.value) == message


def test_engine_is_worker_or_spark_and_spark_remote_needs_spark():
    from trainops.staging.options import check_engine

    assert check_engine("worker") == "worker"
    assert check_engine("spark", spark_remote="sc://connect:15002") == "spark"
    with pytest.raises(ValueError, match=r"engine must be one of \['worker', 'spark'\], got 'Spark'"):
        check_engine("Spark")
    with pytest.raises(ValueError, match="must be a Spark Connect URL such as 'sc://"):
        check_engine("spark", spark_remote="localhost:15002")
    with pytest.raises(ValueError, match="spark_remote 'sc://c:1' is only used with engine='spark'"):
        check_engine("worker", spark_remote="sc://c:1")


def test_a_fixed_label_set_is_two_or_more_distinct_names_for_classification_only():
    from trainops.staging.options import check_labels

    assert check_labels(None, "classification") is None
    assert check_labels(("spam", "ham"), "classification") == ["spam", "ham"]
    for bad in (["spam"], ["spam", "spam"], ["spam", ""], "spam,ham", ["spam", 1]):
        with pytest.raises(
            ValueError, match=r"labels must be a list of two or more distinct, non-empty label names"
        ):
            check_labels(bad, "classification")
    with pytest.raises(
        ValueError, match=r"labels \['a', 'b'\] are only used with task='classification', got task 'sft'"
    ):
        check_labels(["a", "b"], "sft")


def test_a_task_is_one_staging_can_stage_for_on_its_engine():
    from trainops.staging.options import check_task

    assert check_task("sft", "worker") == "sft" and check_task("causal_lm", "spark") == "causal_lm"
    assert check_task("classification", "worker") == "classification"
    with pytest.raises(
        ValueError, match=r"task 'translation' cannot be staged: pick one of causal_lm, sft, classification"
    ):
        check_task("translation", "worker")
    with pytest.raises(ValueError, match=r"task 'classification' stages on the worker engine only for now"):
        check_task("classification", "spark")
    with pytest.raises(ValueError, match=r"task 'sft' stages on the worker engine only for now"):
        check_task("sft", "spark")
