"""The export's tokenizer files: the byte tokenizer built as JSON, a staged Hugging Face one copied."""

import hashlib
import json
import random

import pytest

from trainer.export.tokenizer_files import (
    GENERATION_CONFIG,
    TokenIds,
    byte_level_chars,
    generation_config,
    token_id,
    tokenizer_files,
)

BYTE = {"kind": "byte", "vocab_size": 257, "eos_id": 256}
TEXTS = [
    "",
    "hello world",
    "  leading and trailing spaces  ",
    "tabs\tnew\nlines\r\n",
    "caf\u00e9 \u00fcber \u65e5\u672c\u8a9e \U0001f600",
    "\x00\x01\x7f control bytes",
    "a<|endoftext|>b</s><s>",  # special-token text is bytes, as staging encoded it
    "".join(chr(c) for c in range(32, 0x2FF)),
]


def random_texts(count: int) -> list[str]:
    rng = random.Random(0)
    alphabet = [chr(c) for c in [*range(0x250), 0x3A9, 0x20AC, 0x4E2D, 0x1F642]]
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40))) for _ in range(count)]


def write(folder, files):
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return folder


def test_the_byte_alphabet_is_a_bijection_over_the_256_bytes():
    chars = byte_level_chars()
    assert len(set(chars)) == 256 and chars[ord("a")] == "a" and chars[ord(" ")] == "\u0120"


def test_the_tokenizers_library_encodes_any_text_to_its_utf8_bytes_and_decodes_it_back():
    tokenizers = pytest.importorskip("tokenizers")
    files = tokenizer_files(BYTE, 64, read=lambda uri: None).files
    tok = tokenizers.Tokenizer.from_str(files["tokenizer.json"].decode())
    assert tok.get_vocab_size() == 257 and tok.token_to_id("<|endoftext|>") == 256
    for text in TEXTS + random_texts(200):
        ids = tok.encode(text).ids
        assert ids == list(text.encode("utf-8")), text
        assert tok.decode(ids) == text


def test_transformers_loads_the_byte_tokenizer_and_encodes_as_staging_did(tmp_path):
    transformers = pytest.importorskip("transformers")
    made = tokenizer_files(BYTE, 64, read=lambda uri: None)
    assert made.ids == TokenIds(eos=256, bos=256, pad=None)
    folder = write(tmp_path / "tok", made.files)
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    assert (tok.eos_token_id, tok.bos_token_id, tok.pad_token_id, tok.model_max_length) == (
        256,
        256,
        None,
        64,
    )
    for text in TEXTS + random_texts(200):
        # staging stores a record as its bytes, then EOS: nothing else is added, even by default
        assert tok.encode(text) == tok(text, add_special_tokens=False).input_ids == list(text.encode("utf-8"))
        assert tok.decode([*list(text.encode("utf-8")), 256], skip_special_tokens=True) == text
    assert tok.decode([104, 105, 256]) == "hi<|endoftext|>"


def test_a_byte_tokenizer_other_than_stagings_is_refused():
    with pytest.raises(ValueError, match=r"is not staging's \(vocab_size 257, eos_id 256\); re-stage"):
        tokenizer_files({**BYTE, "vocab_size": 300}, 64, read=lambda uri: None)
    with pytest.raises(
        ValueError, match=r"tokenizer kind 'sentencepiece' is neither 'byte' nor 'huggingface'"
    ):
        tokenizer_files({"kind": "sentencepiece"}, 64, read=lambda uri: None)


def staged_hf_tokenizer() -> bytes:
    tokenizers = pytest.importorskip("tokenizers")
    vocab = {"<s>": 0, "</s>": 1, "<pad>": 2, "[UNK]": 3, "hello": 4, "world": 5}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.add_special_tokens(["<s>", "</s>", "<pad>"])
    return tok.to_str().encode()


def test_a_staged_hugging_face_tokenizer_is_copied_with_its_config_and_the_manifests_eos(tmp_path):
    transformers = pytest.importorskip("transformers")
    data = staged_hf_tokenizer()
    store = {
        "s3://b/tok/tokenizer.json": data,
        "s3://b/tok/tokenizer_config.json": json.dumps(
            {
                "bos_token": "<s>",
                "pad_token": {"__type": "AddedToken", "content": "<pad>"},
                "eos_token": "<s>",
            }
        ).encode(),
    }
    spec = {
        "kind": "huggingface",
        "uri": "s3://b/tok/tokenizer.json",
        "sha256": hashlib.sha256(data).hexdigest(),
        "eos_token": "</s>",
        "eos_id": 1,
        "vocab_size": 6,
    }
    made = tokenizer_files(spec, 128, read=store.get)
    assert made.files["tokenizer.json"] == data
    assert made.ids == TokenIds(eos=1, bos=0, pad=2)
    config = json.loads(made.files["tokenizer_config.json"])
    assert (config["eos_token"], config["model_max_length"]) == ("</s>", 128)  # the token staging appended
    tok = transformers.AutoTokenizer.from_pretrained(write(tmp_path / "tok", made.files))
    assert tok("hello world", add_special_tokens=False).input_ids == [4, 5]
    assert (tok.eos_token_id, tok.bos_token_id, tok.pad_token_id) == (1, 0, 2)

    # Only a tokenizer.json, under another name: a config is written, no bos or pad to name.
    alone = tokenizer_files({**spec, "uri": "s3://b/x/mine.json"}, 16, read={"s3://b/x/mine.json": data}.get)
    assert sorted(alone.files) == ["tokenizer.json", "tokenizer_config.json"]
    assert alone.ids == TokenIds(eos=1) and alone.ids.fields() == {"bos_token_id": None, "eos_token_id": 1}


def test_a_staged_tokenizer_that_changed_or_is_gone_is_refused_by_name():
    data = staged_hf_tokenizer()
    spec = {"kind": "huggingface", "uri": "s3://b/tok/tokenizer.json", "sha256": "0" * 64, "eos_id": 1}
    with pytest.raises(
        ValueError, match=r"'s3://b/tok/tokenizer.json' has sha256 [0-9a-f]{64}, but the dataset"
    ):
        tokenizer_files(spec, 16, read={spec["uri"]: data}.get)
    with pytest.raises(
        FileNotFoundError, match=r"staged with the tokenizer 's3://b/tok/tokenizer.json', which"
    ):
        tokenizer_files(spec, 16, read=lambda uri: None)


def test_token_ids_resolve_through_added_tokens_and_every_vocabulary_form():
    assert token_id({"added_tokens": [{"id": 7, "content": "<x>"}], "model": {"vocab": {}}}, "<x>") == 7
    assert token_id({"model": {"vocab": {"a": 3}}}, "a") == 3
    assert token_id({"model": {"vocab": [["<unk>", 0.0], ["<s>", 0.0]]}}, "<s>") == 1  # Unigram
    assert token_id({"model": {"vocab": {"a": 3}}}, "b") is None and token_id({}, None) is None


def test_generation_config_carries_the_ids_and_the_trained_context(tmp_path):
    transformers = pytest.importorskip("transformers")
    document = generation_config(TokenIds(eos=1, bos=0, pad=2), 256)
    assert document == {
        "bos_token_id": 0,
        "eos_token_id": 1,
        "pad_token_id": 2,
        "max_length": 256,
        "do_sample": False,
    }
    (tmp_path / GENERATION_CONFIG).write_text(json.dumps(document))
    loaded = transformers.GenerationConfig.from_pretrained(tmp_path)
    assert (loaded.eos_token_id, loaded.pad_token_id, loaded.max_length) == (1, 2, 256)


CHATML = (
    "{% for m in messages %}{{ '<s>' + m['role'] + ' ' + m['content'] + '<pad>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<s>assistant ' }}{% endif %}"
)


@pytest.mark.parametrize("where", ["tokenizer_config.json", "chat_template.jinja"])
def test_a_model_tuned_on_a_chat_template_ships_it_and_stops_at_the_folders_end_of_turn(tmp_path, where):
    """An instruction-tuned tokenizer (Qwen2-Instruct's: eos_token <|im_end|>, pad <|endoftext|>)
    staged for sft through its template (staging appended </s> after causal records, never after a
    templated turn): the export keeps the folder's EOS (here <pad>, the template's end of turn) and
    ships the template, so transformers' apply_chat_template renders what staging rendered and
    generate stops at the end of the turn, or at the staged end of record."""
    transformers = pytest.importorskip("transformers")
    data = staged_hf_tokenizer()
    config = {"eos_token": "<pad>", "pad_token": "</s>"}
    store = {"s3://b/tok/tokenizer.json": data}
    if where == "chat_template.jinja":
        store["s3://b/tok/chat_template.jinja"] = CHATML.encode()
    else:
        config["chat_template"] = CHATML
    store["s3://b/tok/tokenizer_config.json"] = json.dumps(config).encode()
    spec = {
        "kind": "huggingface",
        "uri": "s3://b/tok/tokenizer.json",
        "sha256": hashlib.sha256(data).hexdigest(),
        "eos_token": "</s>",
        "eos_id": 1,
        "chat_template_sha256": hashlib.sha256(CHATML.encode()).hexdigest(),
    }
    made = tokenizer_files(spec, 64, read=store.get)
    assert made.ids == TokenIds(eos=2, pad=1, stops=(1,))
    assert json.loads(made.files["tokenizer_config.json"])["eos_token"] == "<pad>"  # the folder's own
    assert generation_config(made.ids, 64)["eos_token_id"] == [2, 1]
    folder = write(tmp_path / "export", made.files)
    (folder / GENERATION_CONFIG).write_text(json.dumps(generation_config(made.ids, 64)))
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    chat = [{"role": "user", "content": "hello"}]
    assert tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False) == (
        "<s>user hello<pad><s>assistant "
    )
    assert tok.eos_token_id == 2
    assert transformers.GenerationConfig.from_pretrained(folder).eos_token_id == [2, 1]

    # The same dataset without the template (staged before it was added): the staged EOS, as before.
    plain = tokenizer_files({**spec, "chat_template_sha256": None}, 64, read=store.get)
    assert plain.ids == TokenIds(eos=1, pad=1)
    assert json.loads(plain.files["tokenizer_config.json"])["eos_token"] == "</s>"


def test_a_chat_template_changed_or_gone_since_staging_is_refused_by_name():
    data = staged_hf_tokenizer()
    spec = {
        "kind": "huggingface",
        "uri": "s3://b/tok/tokenizer.json",
        "sha256": hashlib.sha256(data).hexdigest(),
        "eos_id": 1,
        "chat_template_sha256": hashlib.sha256(CHATML.encode()).hexdigest(),
    }
    other = {spec["uri"]: data, "s3://b/tok/chat_template.jinja": b"{{ messages }}"}
    with pytest.raises(ValueError, match=r"staged with the chat template of s3://b/tok \(sha256 [0-9a-f]{8}"):
        tokenizer_files(spec, 16, read=other.get)
    with pytest.raises(ValueError, match=r"that folder now holds no chat template; put the staged"):
        tokenizer_files(spec, 16, read={spec["uri"]: data}.get)
