"""The run contract's tasks: what a dataset was staged for, read the same way on both sides."""

import pytest

from trainer.contract import TASK_CAUSAL_LM, TASK_SFT, dataset_task, split_records


def test_a_manifest_without_a_task_is_causal_lm_and_a_named_one_is_read():
    assert dataset_task({"format": "trainops.dataset/v1"}) == TASK_CAUSAL_LM
    assert dataset_task({"task": {"kind": "sft"}}) == TASK_SFT


def test_an_unknown_task_is_refused_naming_it_and_the_known_ones():
    with pytest.raises(
        ValueError, match=r"staged for task 'ranking', which this trainer does not know \(causal_lm, sft"
    ):
        dataset_task({"task": {"kind": "ranking"}})


def test_a_record_tasks_split_lists_its_records_and_a_token_streams_none():
    records = {"path": "train/records.bin", "count": 3, "sha256": "ab"}
    manifest = {"splits": {"train": {"tokens": 9, "records": records}, "eval": {"tokens": 4}}}
    assert split_records(manifest, "train") == records
    assert split_records(manifest, "eval") is None and split_records({}, "train") is None


def test_a_folders_chat_template_is_found_where_transformers_finds_it():
    from trainer.contract import chat_template_text

    assert chat_template_text({"chat_template": "{{ x }}"}, b"{{ jinja }}") == "{{ jinja }}"  # the file wins
    assert chat_template_text({"chat_template": "{{ x }}"}, None) == "{{ x }}"
    named = [{"name": "tool_use", "template": "{{ t }}"}, {"name": "default", "template": "{{ d }}"}]
    assert chat_template_text({"chat_template": named}, None) == "{{ d }}"
    assert chat_template_text({"chat_template": named[:1]}, None) is None
    assert chat_template_text({"chat_template": ""}, None) is None and chat_template_text({}, None) is None
