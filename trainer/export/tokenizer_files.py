"""The tokenizer files of an export, from the dataset manifest's tokenizer spec; pure, torch-free.

Staging records how it tokenized in the manifest (``tokenizer``); the export ships a tokenizer
that encodes the same way, so ``AutoTokenizer.from_pretrained(folder)`` works on the export:

- the built-in byte tokenizer (``{"kind": "byte", "vocab_size": 257, "eos_id": 256}``): a
  ``tokenizer.json`` built here as plain JSON (a byte-level BPE with no merges: token ``b`` is
  byte ``b``, 256 is ``<|endoftext|>``) and a ``tokenizer_config.json``;
- a staged Hugging Face tokenizer (``{"kind": "huggingface", "uri", "sha256", "eos_token",
  "eos_id", ...}``): the staged ``tokenizer.json`` (checked against the manifest's sha256), with
  the ``tokenizer_config.json``, ``special_tokens_map.json`` and ``chat_template.jinja`` beside it
  when there are any. A chat template that staging rendered ``sft`` records with (the manifest's
  ``chat_template_sha256``) must still be the folder's, and the model keeps the folder's own
  ``eos_token`` (the template's end of turn, ``<|im_end|>`` for ChatML): it was tuned to end its
  answers with it, so generation stops there (and at the staged end of record).

Staging appends EOS after every record and adds no other special token, so a record's staged
ids are ``tokenizer(text, add_special_tokens=False).input_ids + [eos_token_id]`` for either
kind. The byte tokenizer adds no special token even when asked (no post-processor), so there
``encode(text)`` is the record's bytes, and it never reads special-token text in the input as
a special token (``split_special_tokens``): any text encodes to its UTF-8 bytes, as staging did.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from trainer.contract import CHAT_TEMPLATE_FILE, chat_template_text

TOKENIZER_JSON = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
SPECIAL_TOKENS_MAP = "special_tokens_map.json"
GENERATION_CONFIG = "generation_config.json"
# Files a staged Hugging Face tokenizer may keep beside its tokenizer.json; copied when present.
HF_SIBLINGS = (TOKENIZER_CONFIG, SPECIAL_TOKENS_MAP, CHAT_TEMPLATE_FILE)
BYTE_VOCAB_SIZE, BYTE_EOS_ID = 257, 256  # staging's byte tokenizer (trainops.staging.tokenize)
BYTE_EOS_TOKEN = "<|endoftext|>"


@dataclass(frozen=True)
class TokenIds:
    """The special token ids ``config.json`` and ``generation_config.json`` carry (None: none);
    ``stops``: more ids that end generation (``generation_config.json`` lists them after ``eos``)."""

    eos: int
    bos: int | None = None
    pad: int | None = None
    stops: tuple[int, ...] = ()

    def fields(self) -> dict[str, int | None]:
        """``bos_token_id``, ``eos_token_id`` and, when the tokenizer has one, ``pad_token_id``."""
        out: dict[str, int | None] = {"bos_token_id": self.bos, "eos_token_id": self.eos}
        if self.pad is not None:
            out["pad_token_id"] = self.pad
        return out


@dataclass(frozen=True)
class TokenizerFiles:
    """What the export writes for the tokenizer: ``{file name: bytes}`` and the special ids."""

    files: dict[str, bytes]
    ids: TokenIds
    spec: dict[str, Any] = field(default_factory=dict)  # the manifest's tokenizer spec (export.json's)


def _json_bytes(document: Any) -> bytes:
    return (json.dumps(document, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


def byte_level_chars() -> list[str]:
    """The byte-level alphabet of ``tokenizers``' ``ByteLevel`` (GPT-2's): the character of byte ``b``.

    Printable bytes stand for themselves; the others are mapped past U+00FF, in byte order.
    """
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars: dict[int, str] = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def byte_tokenizer_json() -> dict[str, Any]:
    """A ``tokenizers`` JSON document that encodes text to its UTF-8 bytes (ids 0-255), EOS 256.

    The pre-tokenizer turns the whole text (no regex split) into byte-level characters and the
    BPE model, with no merges, maps each to its byte. ``<|endoftext|>`` is a vocabulary entry,
    not an added token, so the ``tokenizers`` library alone never matches it in text either.
    """
    vocab = {char: byte for byte, char in enumerate(byte_level_chars())}
    vocab[BYTE_EOS_TOKEN] = BYTE_EOS_ID
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [],
        "normalizer": None,
        "pre_tokenizer": byte_level,
        "post_processor": None,
        "decoder": byte_level,
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": [],
        },
    }


def byte_tokenizer_files(spec: Mapping[str, Any], model_max_length: int) -> TokenizerFiles:
    """The byte tokenizer's files; BOS is EOS (a record starts after the previous one's EOS)."""
    if (spec.get("vocab_size"), spec.get("eos_id")) != (BYTE_VOCAB_SIZE, BYTE_EOS_ID):
        raise ValueError(
            f"the manifest's byte tokenizer {dict(spec)} is not staging's (vocab_size {BYTE_VOCAB_SIZE}, "
            f"eos_id {BYTE_EOS_ID}); re-stage the dataset with this trainops"
        )
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BYTE_EOS_TOKEN,
        "eos_token": BYTE_EOS_TOKEN,
        "model_max_length": int(model_max_length),
        "clean_up_tokenization_spaces": False,
        # Text that spells "<|endoftext|>" is bytes, as staging encoded it, not token 256.
        "split_special_tokens": True,
    }
    files = {
        TOKENIZER_JSON: _json_bytes(byte_tokenizer_json()),
        TOKENIZER_CONFIG: _json_bytes(config),
        SPECIAL_TOKENS_MAP: _json_bytes({"bos_token": BYTE_EOS_TOKEN, "eos_token": BYTE_EOS_TOKEN}),
    }
    return TokenizerFiles(files, TokenIds(eos=BYTE_EOS_ID, bos=BYTE_EOS_ID))


def _token_text(value: Any) -> str | None:
    """A special token as ``tokenizer_config.json`` spells it: a string or ``{"content": ...}``."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


def token_id(tokenizer: Mapping[str, Any], token: str | None) -> int | None:
    """The id of ``token`` in a ``tokenizer.json`` document (added tokens, then the vocabulary)."""
    if token is None:
        return None
    for added in tokenizer.get("added_tokens") or []:
        if added.get("content") == token:
            return int(added["id"])
    vocab = (tokenizer.get("model") or {}).get("vocab")
    if isinstance(vocab, dict):
        found = vocab.get(token)
        return int(found) if found is not None else None
    if isinstance(vocab, list):  # Unigram: [[piece, score], ...], the id is the position
        for number, entry in enumerate(vocab):
            if entry and entry[0] == token:
                return number
    return None


def hf_tokenizer_files(
    spec: Mapping[str, Any], model_max_length: int, read: Callable[[str], bytes | None]
) -> TokenizerFiles:
    """A staged Hugging Face tokenizer's files, read with ``read(uri)`` (None: no such file).

    ``tokenizer_config.json`` gets the manifest's EOS (the token staging appended) and a
    ``model_max_length`` when it has none; one is written when the tokenizer has none.
    """
    uri = spec["uri"]
    data = read(uri)
    if data is None:
        raise FileNotFoundError(
            f"the dataset was staged with the tokenizer {uri!r}, which no longer exists; "
            f"put the staged tokenizer.json back there to export the model"
        )
    digest = hashlib.sha256(data).hexdigest()
    if spec.get("sha256") and digest != spec["sha256"]:
        raise ValueError(
            f"tokenizer {uri!r} has sha256 {digest}, but the dataset was staged with {spec['sha256']}; "
            f"put the staged tokenizer.json back there to export the model"
        )
    folder = uri.rsplit("/", 1)[0]
    files = {TOKENIZER_JSON: data}
    for name in HF_SIBLINGS:
        sibling = read(f"{folder}/{name}")
        if sibling is not None:
            files[name] = sibling
    config = json.loads(files[TOKENIZER_CONFIG]) if TOKENIZER_CONFIG in files else {}
    special = json.loads(files[SPECIAL_TOKENS_MAP]) if SPECIAL_TOKENS_MAP in files else {}
    config.setdefault("tokenizer_class", "PreTrainedTokenizerFast")
    config.setdefault("model_max_length", int(model_max_length))
    document = json.loads(data)
    staged_eos = int(spec["eos_id"])
    end_of_turn = _chat_end_of_turn(spec, folder, config, files.get(CHAT_TEMPLATE_FILE), document)
    if end_of_turn is not None:  # tuned on the template's turns: they end with the folder's EOS
        eos, stops = end_of_turn, (() if end_of_turn == staged_eos else (staged_eos,))
    else:
        eos, stops = staged_eos, ()
        if spec.get("eos_token"):
            config["eos_token"] = spec["eos_token"]
    files[TOKENIZER_CONFIG] = _json_bytes(config)
    bos = _token_text(config.get("bos_token")) or _token_text(special.get("bos_token"))
    pad = _token_text(config.get("pad_token")) or _token_text(special.get("pad_token"))
    ids = TokenIds(eos=eos, bos=token_id(document, bos), pad=token_id(document, pad), stops=stops)
    return TokenizerFiles(files, ids)


def _chat_end_of_turn(
    spec: Mapping[str, Any],
    folder: str,
    config: Mapping[str, Any],
    jinja: bytes | None,
    document: Mapping[str, Any],
) -> int | None:
    """The id of the folder's own ``eos_token`` when staging rendered the records with its chat
    template (None when it did not, or the folder names no EOS the tokenizer has). ValueError
    when the folder's template is gone or is not the one staging rendered with."""
    staged = spec.get("chat_template_sha256")
    if not staged:
        return None
    template = chat_template_text(config, jinja)
    digest = hashlib.sha256(template.encode()).hexdigest() if template is not None else None
    if digest != staged:
        found = f"a chat template with sha256 {digest}" if digest else "no chat template"
        raise ValueError(
            f"the dataset was staged with the chat template of {folder} (sha256 {staged}), but that "
            f"folder now holds {found}; put the staged tokenizer_config.json / chat_template.jinja back "
            "there to export the model"
        )
    return token_id(document, _token_text(config.get("eos_token")))


def tokenizer_files(
    spec: Mapping[str, Any], model_max_length: int, read: Callable[[str], bytes | None]
) -> TokenizerFiles:
    """The export's tokenizer files for the manifest's ``tokenizer`` spec (see the module docstring)."""
    kind = spec.get("kind")
    if kind == "byte":
        return replace(byte_tokenizer_files(spec, model_max_length), spec=dict(spec))
    if kind == "huggingface":
        return replace(hf_tokenizer_files(spec, model_max_length, read), spec=dict(spec))
    raise ValueError(
        f"the manifest's tokenizer kind {kind!r} is neither 'byte' nor 'huggingface'; "
        f"re-stage the dataset with this trainops"
    )


def generation_config(ids: TokenIds, max_length: int) -> dict[str, Any]:
    """``generation_config.json``: the special ids, and ``max_length`` the trained context.

    The model never saw a position past ``max_length``, so prompt and generated tokens together
    stop there by default; a caller's ``max_new_tokens`` still takes precedence.
    """
    fields: dict[str, Any] = dict(ids.fields())
    if ids.stops:  # transformers stops at any id of the list
        fields["eos_token_id"] = [ids.eos, *ids.stops]
    return {**fields, "max_length": int(max_length), "do_sample": False}
