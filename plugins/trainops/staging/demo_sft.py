"""The ``sft`` demo's data and tokenizer, built locally (no hub access), deterministic.

- Prompt/response records over the demo text (:mod:`trainops.staging.demo_data`): the prompt is
  a post and ``source:``, the response the source that wrote it (``news``, ``forum`` or
  ``docs``), which each source's own templates make learnable in a hundred steps.
- A tokenizer folder as an instruction-tuned Qwen2 ships one: a byte-level BPE
  ``tokenizer.json`` trained with ``tokenizers`` on the same text (special tokens
  ``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>``) and a ``tokenizer_config.json`` with the
  ChatML chat template and ``<|im_end|>`` as its ``eos_token``. Staging renders each record as the
  one-turn conversation the template makes of it (:mod:`trainops.staging.chat`) and encodes it
  with this tokenizer; the exported model ships the folder, so ``apply_chat_template`` and
  ``generate`` work on it as on a hub model, stopping at the end of the assistant's turn.
"""

from __future__ import annotations

import json

from trainer.contract import TOKENIZER_CONFIG_FILE, join
from trainer.storage import open_storage
from trainops.staging.demo_data import demo_rows

EOS_TOKEN = "<|endoftext|>"  # the end of record staging appends (its first known EOS)
TURN_START, TURN_END = "<|im_start|>", "<|im_end|>"
TOKENIZER_VOCAB = 512
# ChatML, as Qwen2-Instruct's template renders it when no system message is given (no default one).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def demo_instructions(rows: int = 2000, *, seed: int = 0) -> dict[str, list]:
    """Column lists ``id``, ``prompt``, ``response``, ``source`` (pure, deterministic)."""
    cols = demo_rows(rows, seed=seed)
    return {
        "id": [f"q-{i}" for i in cols["id"]],
        "prompt": [f"{text}\nsource:" for text in cols["text"]],
        "response": [f" {source}" for source in cols["source"]],
        "source": list(cols["source"]),
    }


def write_demo_sft_dataset(uri: str, *, rows: int = 2000, seed: int = 0, storage=None) -> dict:
    """Write ``<uri>/part-00000.parquet``; return ``{"uri", "rows", "files"}``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    storage = storage or open_storage(uri)
    table = pa.table(demo_instructions(rows, seed=seed))
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    part = join(uri, "part-00000.parquet")
    storage.put(part, sink.getvalue().to_pybytes())
    return {"uri": uri.rstrip("/"), "rows": rows, "files": [part]}


def demo_tokenizer_json(vocab_size: int = TOKENIZER_VOCAB) -> bytes:
    """A byte-level BPE tokenizer trained on the demo text (every source's templates and words),
    as ``tokenizer.json`` bytes; the same bytes on every call."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TOKEN, TURN_START, TURN_END],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = demo_instructions(4000, seed=0)
    tokenizer.train_from_iterator(
        [p + r for p, r in zip(corpus["prompt"], corpus["response"], strict=True)], trainer
    )
    return tokenizer.to_str().encode()


def demo_tokenizer_config() -> bytes:
    """The folder's ``tokenizer_config.json``: the chat template and the special tokens, as
    Qwen2-Instruct's names them (``<|im_end|>`` ends a turn and is its EOS)."""
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": CHAT_TEMPLATE,
        "bos_token": None,
        "eos_token": TURN_END,
        "pad_token": EOS_TOKEN,
        "clean_up_tokenization_spaces": False,
    }
    return (json.dumps(config, indent=2) + "\n").encode()


def write_demo_tokenizer(uri: str, storage=None) -> str:
    """Write the demo tokenizer's folder: ``uri`` (its ``tokenizer.json``) and the
    ``tokenizer_config.json`` beside it, each unless it is there (a staged dataset names these
    files by hash); return ``uri``."""
    storage = storage or open_storage(uri)
    folder = uri.rsplit("/", 1)[0]
    for file_uri, make in (
        (uri, demo_tokenizer_json),
        (join(folder, TOKENIZER_CONFIG_FILE), demo_tokenizer_config),
    ):
        if storage.head(file_uri) is None:
            storage.put(file_uri, make())
    return uri
