"""Content-addressed dataset versions.

The version is a hash of everything that decides the staged bytes: the input objects'
identities (ETag, or size and mtime), the suite, the tokenizer (for a Hugging Face one,
the sha256 of its JSON), the split rule, the shard size, the slice columns of the eval
index and, when set, the quarantine options. The same inputs give the same version (and staging reuses
it); changing any of them gives a new one.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

VERSION_CHARS = 12


def version_inputs(
    objects: Sequence[dict],
    *,
    expectations: list[dict],
    tokenizer: dict,
    split_rule: dict,
    shard_tokens: int,
    slice_columns: Sequence[str],
    quarantine: dict | None = None,
    task: str = "causal_lm",
    labels: Sequence[str] | None = None,
) -> dict:
    """The plain dict the version hashes; ``objects`` are ``SourceObject.identity()`` dicts.

    ``quarantine`` decides which rows are staged, so it counts when set; without it the
    inputs (and so the versions staged before quarantine existed) are unchanged. So does a
    ``task`` other than ``causal_lm``.
    """
    inputs = {
        "objects": sorted(objects, key=lambda o: o["uri"]),
        "expectations": expectations,
        "tokenizer": tokenizer,
        "split_rule": split_rule,
        "shard_tokens": int(shard_tokens),
        "slice_columns": list(slice_columns),
    }
    if quarantine is not None:
        inputs["quarantine"] = dict(quarantine)
    if task != "causal_lm":
        inputs["task"] = task
    if labels is not None:  # a fixed label set numbers the labels: it decides the records
        inputs["labels"] = list(labels)
    return inputs


def dataset_version(inputs: dict) -> str:
    """First 12 hex characters of sha256 over the canonical JSON of ``inputs``."""
    canonical = json.dumps(inputs, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:VERSION_CHARS]
