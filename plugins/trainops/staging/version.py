"""Content-addressed dataset versions.

The version is a hash of everything that decides the staged bytes: the input objects'
identities, the suite, the tokenizer, the split rule, the shard size and the slice
columns of the eval index. The same inputs give the same version (and staging reuses
it); changing any of them gives a new one.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

VERSION_CHARS = 12


def version_inputs(objects: Sequence[dict], *, expectations: list[dict], tokenizer: dict,
                   split_rule: dict, shard_tokens: int, slice_columns: Sequence[str]) -> dict:
    """The plain dict the version hashes; ``objects`` are ``SourceObject.identity()`` dicts."""
    return {
        "objects": sorted(objects, key=lambda o: o["uri"]),
        "expectations": expectations,
        "tokenizer": tokenizer,
        "split_rule": split_rule,
        "shard_tokens": int(shard_tokens),
        "slice_columns": list(slice_columns),
    }


def dataset_version(inputs: dict) -> str:
    """First 12 hex characters of sha256 over the canonical JSON of ``inputs``."""
    canonical = json.dumps(inputs, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:VERSION_CHARS]
