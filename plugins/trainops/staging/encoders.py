"""Tokenizers that turn a batch of texts into one token array: built-in bytes, or Hugging Face.

``encode_batch(texts)`` takes a pyarrow string array without nulls and returns
``(tokens, lengths)``: every record's tokens followed by EOS, concatenated, as a numpy
array of the tokenizer's ``dtype``, and each record's token count (EOS included).
``encode_batch(texts, special=True)`` (a classifier's records) frames each record as the model
was pretrained to read it instead: a Hugging Face tokenizer's own post-processor (BERT's
``[CLS] text [SEP]``), no EOS added; the byte tokenizer has no framing and ends it with EOS.
``config`` is what the manifest records and the dataset version hashes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

from trainer.storage import NotFound
from trainer.storage import open_storage as default_open
from trainops.staging.chat import ChatTemplate, read_chat_template
from trainops.staging.errors import StagingError
from trainops.staging.tokenize import BYTE_EOS_ID, BYTE_VOCAB_SIZE, TOKENIZER, token_dtype_for

EOS_CANDIDATES = ("</s>", "<|endoftext|>", "<eos>", "<|end_of_text|>", "[SEP]")


class ByteTokenizer:
    """UTF-8 bytes, then EOS 256: no vocabulary to ship, any text encodes."""

    chat = None  # bytes have no chat template

    def use_chat_template(self, read: Callable[[str], bytes | None]) -> None:
        """Bytes have no chat template: nothing to do."""

    def __init__(self):
        self.config = dict(TOKENIZER)
        self.eos_id = BYTE_EOS_ID
        self.dtype = token_dtype_for(BYTE_VOCAB_SIZE)

    def encode_batch(self, texts, special: bool = False):
        import numpy as np
        import pyarrow as pa

        texts = _compact(texts)
        width = 8 if pa.types.is_large_string(texts.type) else 4
        offsets = np.frombuffer(texts.buffers()[1], dtype=f"<i{width}")[: len(texts) + 1]
        data = texts.buffers()[2]
        raw = (
            np.frombuffer(data, dtype=np.uint8)[offsets[0] : offsets[-1]]
            if data is not None
            else np.zeros(0, dtype=np.uint8)
        )
        lengths = np.diff(offsets).astype(np.int64) + 1
        tokens = np.full(len(raw) + len(texts), self.eos_id, dtype=self.dtype)
        is_text = np.ones(len(tokens), dtype=bool)
        is_text[np.cumsum(lengths) - 1] = False
        tokens[is_text] = raw
        return tokens, lengths


class HFTokenizer:
    """A Hugging Face ``tokenizers`` JSON file; EOS is appended after every record."""

    chat: ChatTemplate | None = None  # set by use_chat_template when its folder has one

    def use_chat_template(self, read: Callable[[str], bytes | None]) -> None:
        """Render ``sft`` records with the chat template beside the tokenizer, if it has one
        (:mod:`trainops.staging.chat`); its sha256 joins :attr:`config`, so the version counts it
        and the manifest says it was applied."""
        self.chat = read_chat_template(str(self.config["uri"]), read)
        if self.chat is not None:
            self.config["chat_template_sha256"] = self.chat.sha256

    def __init__(self, data: bytes, *, uri: str, eos_token: str | None = None):
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise StagingError(
                f"tokenizer {uri!r} is a Hugging Face tokenizer, but the 'tokenizers' package is "
                "not installed where staging runs: pip install tokenizers, or stage with the "
                "built-in byte tokenizer (tokenizer=None)"
            ) from None
        try:
            self._tok = Tokenizer.from_str(data.decode("utf-8"))
        except Exception as exc:
            raise StagingError(
                f"tokenizer {uri!r} is not a Hugging Face tokenizer.json ({exc}): save it with "
                "tokenizer.save(path) and point tokenizer at that file"
            ) from None
        vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        names = (eos_token,) if eos_token else EOS_CANDIDATES
        ids = [(n, self._tok.token_to_id(n)) for n in names]
        found = [(n, i) for n, i in ids if i is not None]
        if not found:
            raise StagingError(
                f"tokenizer {uri!r} has no end-of-record token {' or '.join(names)}: name the "
                "one it has with tokenizer={'uri': ..., 'eos_token': '...'}"
            )
        eos, self.eos_id = found[0]
        vocab_size = max(vocab_size, self.eos_id + 1)
        self.dtype = token_dtype_for(vocab_size)
        self.config = {
            "kind": "huggingface",
            "vocab_size": int(vocab_size),
            "eos_id": int(self.eos_id),
            "eos_token": eos,
            "uri": uri,
            "sha256": hashlib.sha256(data).hexdigest(),
        }

    def encode_batch(self, texts, special: bool = False):
        import numpy as np

        if special:
            framed = self._tok.encode_batch(texts.to_pylist(), add_special_tokens=True)
            lengths = np.fromiter((len(e.ids) for e in framed), dtype=np.int64, count=len(framed))
            ids = [i for e in framed for i in e.ids]
            return np.asarray(ids, dtype=self.dtype), lengths
        encoded = self._tok.encode_batch(texts.to_pylist(), add_special_tokens=False)
        lengths = np.fromiter((len(e.ids) + 1 for e in encoded), dtype=np.int64, count=len(encoded))
        tokens = np.empty(int(lengths.sum()), dtype=self.dtype)
        pos = 0
        for e, n in zip(encoded, lengths, strict=False):
            tokens[pos : pos + n - 1] = e.ids
            tokens[pos + n - 1] = self.eos_id
            pos += n
        return tokens, lengths


def load_tokenizer(spec: dict, open_storage: Callable | None = None):
    """The tokenizer for a checked spec (``options.check_tokenizer``); reads a file for HF."""
    if spec["kind"] == "byte":
        return ByteTokenizer()

    if open_storage is None:
        open_storage = default_open
    uri = spec["uri"]
    try:
        data = open_storage(uri).get(uri)
    except NotFound:
        raise StagingError(
            f"tokenizer {uri!r} does not exist: save the tokenizer.json there or fix the URI"
        ) from None
    return HFTokenizer(data, uri=uri, eos_token=spec.get("eos_token"))


def _compact(texts):
    """A string array whose buffers hold exactly its values (no slice offset)."""
    import pyarrow as pa

    if isinstance(texts, pa.ChunkedArray):
        texts = texts.combine_chunks()
    if pa.types.is_string_view(texts.type):
        texts = texts.cast(pa.large_string())
    if texts.offset:
        texts = pa.concat_arrays([texts])  # copies into fresh buffers
    return texts
