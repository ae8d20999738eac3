"""The sft demo's data and tokenizer: deterministic, learnable, built without the hub."""

from __future__ import annotations

import hashlib

from trainer.storage import open_storage
from trainops.staging.demo_sft import (
    EOS_TOKEN,
    TOKENIZER_VOCAB,
    demo_instructions,
    demo_tokenizer_json,
    write_demo_tokenizer,
)


def test_each_prompt_is_a_post_and_its_response_the_source_that_wrote_it():
    rows = demo_instructions(30, seed=1)
    assert rows == demo_instructions(30, seed=1)  # the same arguments, the same records
    for prompt, response, source in zip(rows["prompt"], rows["response"], rows["source"], strict=True):
        assert prompt.endswith("\nsource:") and response == f" {source}"
    assert len(set(rows["id"])) == 30


def test_the_tokenizer_is_the_same_bytes_every_time_and_knows_the_end_of_record(tmp_path):
    from tokenizers import Tokenizer

    data = demo_tokenizer_json()
    assert hashlib.sha256(data).digest() == hashlib.sha256(demo_tokenizer_json()).digest()
    tokenizer = Tokenizer.from_str(data.decode())
    assert tokenizer.get_vocab_size() == TOKENIZER_VOCAB and tokenizer.token_to_id(EOS_TOKEN) is not None
    post = demo_instructions(1)["prompt"][0]
    assert tokenizer.decode(tokenizer.encode(post).ids) == post  # byte-level: every text round-trips
    uri = (tmp_path / "tok" / "tokenizer.json").as_uri()
    write_demo_tokenizer(uri)
    open_storage(uri).put(uri, b"kept")  # written once: a second demo run keeps what is there
    write_demo_tokenizer(uri)
    assert open_storage(uri).get(uri) == b"kept"
