"""The ``classification`` demo's data and tokenizer, built locally (no hub access), deterministic.

- Text/label records over the demo text (:mod:`trainops.staging.demo_data`): the text is a post,
  the label the source that wrote it (``news``, ``forum`` or ``docs``), which each source's own
  templates make learnable in a few dozen steps.
- A ``tokenizer.json`` trained with ``tokenizers`` on the same text, framed as BERT's: byte-level
  BPE (``tokenizers`` trains WordPiece in a hash-map order that changes from call to call; BPE
  gives the same bytes every time), ``[PAD]`` (id 0, the model's ``pad_token_id``), ``[UNK]``,
  and a post-processor that frames each text as ``[CLS] text [SEP]``, as BERT reads it. Staging encodes the records with it and the
  exported classifier ships with it.
"""

from __future__ import annotations

import json

from trainer.contract import join
from trainer.storage import open_storage
from trainops.staging.demo_data import demo_rows

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"]  # ids 0..3
SHORT_WORDS = 9  # the length slice's bound: about half the demo posts are shorter
TOKENIZER_VOCAB = 512


def demo_labelled(rows: int = 2000, *, seed: int = 0) -> dict[str, list]:
    """Column lists ``id``, ``text``, ``label`` (the post's source) and ``length`` (``short``
    under 9 words, else ``long``: a slice teams watch, as a classifier often does worse on short
    texts) (pure, deterministic)."""
    cols = demo_rows(rows, seed=seed)
    return {
        "id": [f"c-{i}" for i in cols["id"]],
        "text": list(cols["text"]),
        "label": list(cols["source"]),
        "length": ["short" if len(text.split()) < SHORT_WORDS else "long" for text in cols["text"]],
    }


def write_demo_classification_dataset(uri: str, *, rows: int = 2000, seed: int = 0, storage=None) -> dict:
    """Write ``<uri>/part-00000.parquet``; return ``{"uri", "rows", "files"}``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    storage = storage or open_storage(uri)
    sink = pa.BufferOutputStream()
    pq.write_table(pa.table(demo_labelled(rows, seed=seed)), sink)
    part = join(uri, "part-00000.parquet")
    storage.put(part, sink.getvalue().to_pybytes())
    return {"uri": uri.rstrip("/"), "rows": rows, "files": [part]}


def demo_classifier_tokenizer_json(vocab_size: int = TOKENIZER_VOCAB) -> bytes:
    """A byte-level BPE tokenizer trained on the demo text, BERT's framing, as ``tokenizer.json``
    bytes; the same bytes on every call."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(demo_labelled(4000, seed=0)["text"], trainer)
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    return tokenizer.to_str().encode()


# Beside tokenizer.json: its special tokens by role, which the export ships, so that
# transformers' AutoTokenizer pads a batch with [PAD] as the model expects.
TOKENIZER_CONFIG = {
    "tokenizer_class": "PreTrainedTokenizerFast",
    "pad_token": "[PAD]",
    "unk_token": "[UNK]",
    "cls_token": "[CLS]",
    "sep_token": "[SEP]",
}


def write_demo_classifier_tokenizer(uri: str, storage=None) -> str:
    """Write the demo classifier's tokenizer to ``uri`` (a ``tokenizer.json``, and its
    ``tokenizer_config.json`` beside it) unless it is there; return ``uri``."""
    storage = storage or open_storage(uri)
    if storage.head(uri) is None:
        storage.put(
            join(uri.rsplit("/", 1)[0], "tokenizer_config.json"), json.dumps(TOKENIZER_CONFIG).encode()
        )
        storage.put(uri, demo_classifier_tokenizer_json())
    return uri
