"""The ``sft`` demo's data and tokenizer, built locally (no hub access), deterministic.

- Prompt/response records over the demo text (:mod:`trainops.staging.demo_data`): the prompt is
  a post and ``source:``, the response the source that wrote it (``news``, ``forum`` or
  ``docs``), which each source's own templates make learnable in a hundred steps.
- A byte-level BPE ``tokenizer.json`` trained with ``tokenizers`` on the same text, with the
  end-of-record token ``<|endoftext|>``: the tokenizer staging encodes the records with, and the
  one the exported model ships with.
"""

from __future__ import annotations

from trainer.contract import join
from trainer.storage import open_storage
from trainops.staging.demo_data import demo_rows

EOS_TOKEN = "<|endoftext|>"
TOKENIZER_VOCAB = 512


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
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = demo_instructions(4000, seed=0)
    tokenizer.train_from_iterator(
        [p + r for p, r in zip(corpus["prompt"], corpus["response"], strict=True)], trainer
    )
    return tokenizer.to_str().encode()


def write_demo_tokenizer(uri: str, storage=None) -> str:
    """Write the demo tokenizer to ``uri`` (a ``tokenizer.json``) unless it is there; return ``uri``."""
    storage = storage or open_storage(uri)
    if storage.head(uri) is None:
        storage.put(uri, demo_tokenizer_json())
    return uri
