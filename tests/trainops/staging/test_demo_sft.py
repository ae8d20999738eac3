"""The sft demo's data and tokenizer: deterministic, learnable, built without the hub."""

from __future__ import annotations

import hashlib

from trainer.storage import open_storage
from trainops.staging.demo_sft import (
    EOS_TOKEN,
    TOKENIZER_VOCAB,
    TURN_END,
    TURN_START,
    demo_instructions,
    demo_tokenizer_config,
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
    config_uri = (tmp_path / "tok" / "tokenizer_config.json").as_uri()
    assert open_storage(uri).get(config_uri) == demo_tokenizer_config()
    for written in (uri, config_uri):
        open_storage(uri).put(written, b"kept")
    write_demo_tokenizer(uri)  # written once: a second demo run keeps what is there
    assert open_storage(uri).get(uri) == open_storage(uri).get(config_uri) == b"kept"


def test_the_tokenizer_folder_is_an_instruct_models_whose_turns_fit_the_demos_context(tmp_path):
    """transformers reads the folder as a Qwen2-Instruct tokenizer's (ChatML, <|im_end|> ends a
    turn and is its EOS), and staging renders each record as transformers' apply_chat_template
    does; every rendered record fits the demo's seq_len + 1 (49) tokens, so no answer is cut."""
    from transformers import AutoTokenizer

    from trainops.staging.chat import read_chat_template

    uri = (tmp_path / "tok" / "tokenizer.json").as_uri()
    write_demo_tokenizer(uri)
    tok = AutoTokenizer.from_pretrained(tmp_path / "tok")
    assert (tok.eos_token, tok.pad_token) == (TURN_END, EOS_TOKEN)
    assert all(tok.convert_tokens_to_ids(t) < TOKENIZER_VOCAB for t in (TURN_START, TURN_END))
    chat = read_chat_template(uri, lambda u: open_storage(u).head(u) and open_storage(u).get(u))
    rows = demo_instructions(2000)
    lengths = []
    for prompt, response in zip(rows["prompt"], rows["response"], strict=True):
        asked, answer = chat.split(prompt, response)
        turn = [{"role": "user", "content": prompt}]
        assert asked == tok.apply_chat_template(turn, add_generation_prompt=True, tokenize=False)
        assert answer == f"{response}{TURN_END}\n"
        lengths.append(len(tok(asked + answer, add_special_tokens=False).input_ids))
    assert max(lengths) <= 49, max(lengths)
