"""An ``sft`` record rendered with its tokenizer's chat template, as transformers renders it."""

from __future__ import annotations

import json

import pytest

from trainops.staging.chat import ChatTemplate, read_chat_template
from trainops.staging.errors import StagingError

# Qwen2's template, as its tokenizer_config.json holds it (shortened: no tools, no system default)
CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def chat_tokenizer_folder(folder, template: str | None = CHATML, as_file: bool = False) -> str:
    """A small BPE tokenizer.json with ChatML's tokens, and its config (with ``template``)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from tests.trainer.helpers import instructions

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator([p + r for p, r in instructions(300, 0)], trainer)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.json").write_text(tokenizer.to_str())
    config = {
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    if template is not None and as_file:
        (folder / "chat_template.jinja").write_text(template)
    elif template is not None:
        config["chat_template"] = template
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return (folder / "tokenizer.json").as_uri()


def read(uri: str) -> bytes | None:
    from pathlib import Path

    path = Path(uri.removeprefix("file://"))
    return path.read_bytes() if path.exists() else None


@pytest.mark.parametrize("as_file", [False, True])
def test_the_template_beside_the_tokenizer_splits_a_record_as_transformers_renders_it(tmp_path, as_file):
    from transformers import AutoTokenizer

    uri = chat_tokenizer_folder(tmp_path / "tok", as_file=as_file)
    chat = read_chat_template(uri, read)
    assert chat is not None and chat.special["eos_token"] == "<|im_end|>"
    prompt, response = chat.split("who eats the moon?", " the cat.")
    assert prompt == "<|im_start|>user\nwho eats the moon?<|im_end|>\n<|im_start|>assistant\n"
    assert response == " the cat.<|im_end|>\n"
    theirs = AutoTokenizer.from_pretrained(tmp_path / "tok")
    user = [{"role": "user", "content": "who eats the moon?"}]
    assert theirs.apply_chat_template(user, tokenize=False, add_generation_prompt=True) == prompt
    both = [*user, {"role": "assistant", "content": " the cat."}]
    assert theirs.apply_chat_template(both, tokenize=False) == prompt + response


def test_a_folder_without_a_template_has_none_and_a_template_that_cannot_split_is_refused(tmp_path):
    assert read_chat_template(chat_tokenizer_folder(tmp_path / "plain", template=None), read) is None
    odd = ChatTemplate(
        "{% for m in messages %}{{ m['content'] }}{% endfor %}{% if add_generation_prompt %}>>{% endif %}",
        "odd",
    )
    with pytest.raises(
        StagingError, match=r"the chat template of odd renders a conversation that does not begin"
    ):
        odd.split("q", "a")
    failing = ChatTemplate("{{ raise_exception('only user and assistant roles') }}", "strict")
    with pytest.raises(
        StagingError, match=r"the chat template of strict failed on a record: only user and assistant"
    ):
        failing.split("q", "a")


def test_an_sft_source_is_staged_through_the_template_and_its_version_counts_it(file_root, tmp_path):
    import numpy as np
    from tokenizers import Tokenizer

    from tests.trainops.staging.test_stage import sft_source
    from trainer.contract import join
    from trainer.records import read_records
    from trainer.storage import open_storage
    from trainops.staging.stage import stage_dataset

    storage = open_storage(file_root)
    source = sft_source(storage, f"file://{tmp_path}/raw", 40)
    templated = chat_tokenizer_folder(tmp_path / "chat")
    plain = chat_tokenizer_folder(tmp_path / "plain", template=None)
    result = stage_dataset(storage, file_root, source, "chats", task="sft", tokenizer=templated)
    manifest = storage.get_json(result["manifest_uri"])
    assert manifest["tokenizer"]["chat_template_sha256"] == ChatTemplate(CHATML, "x").sha256
    other = stage_dataset(storage, file_root, source, "chats", task="sft", tokenizer=plain)
    assert other["version"] != result["version"]  # the template changes what is staged
    tokenizer = Tokenizer.from_file(templated.removeprefix("file://"))
    info = manifest["splits"]["train"]
    tokens = np.frombuffer(
        b"".join(storage.get(join(result["uri"], s["path"])) for s in info["shards"]), "<u2"
    )
    first, length, prompt = read_records(storage, result["uri"], manifest, "train")[0].tolist()
    asked = tokenizer.decode(tokens[first : first + prompt].tolist(), skip_special_tokens=False)
    answered = tokenizer.decode(tokens[first + prompt : first + length].tolist(), skip_special_tokens=False)
    assert asked.startswith("<|im_start|>user\nQ: who") and asked.endswith(
        "<|im_end|>\n<|im_start|>assistant\n"
    )
    assert answered.endswith(".<|im_end|>\n")  # the template's end of turn; no second end of record
