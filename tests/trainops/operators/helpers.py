"""Helpers shared by the operator tests."""

from __future__ import annotations

from trainer.contract import MANIFEST_NAME, join
from trainer.storage import open_storage
from trainops.staging.manifest import build_manifest
from trainops.staging.tokenize import TOKENIZER, split_rule


def staged_dataset(
    uri: str, *, train_tokens: int = 100_000, vocab_size: int = TOKENIZER["vocab_size"]
) -> str:
    """Write the manifest of a staged dataset version at ``uri`` (built as staging builds it;
    no shards: the operator reads only the manifest) and return ``uri``."""
    shard = {"path": "train/shard-00000.bin", "tokens": train_tokens, "sha256": "0" * 64}
    manifest = build_manifest(
        name="demo",
        version=uri.rstrip("/").rsplit("/", 1)[-1],
        created_at="2026-01-01T00:00:00+00:00",
        source_uri="file:///raw/demo",
        objects=[],
        tokenizer={**TOKENIZER, "vocab_size": vocab_size},
        token_dtype="uint16",
        splits={"train": {"tokens": train_tokens, "shards": [shard]}, "eval": {"tokens": 0, "shards": []}},
        split_rule=split_rule(),
        eval_records=0,
        slice_columns=["source"],
        rows={"total": 10, "train": 10, "eval": 0},
        validation={"success": True},
    )
    open_storage(uri).put_json(join(uri, MANIFEST_NAME), manifest)
    return uri
