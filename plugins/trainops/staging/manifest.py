"""The dataset manifest (``trainops.dataset/v1``): built here, read by the trainer."""

from __future__ import annotations

from collections.abc import Sequence

from trainer.contract import MANIFEST_FORMAT, SPLITS, TASK_CAUSAL_LM, safe_segment
from trainops.staging.errors import StagingError

EVAL_INDEX_PATH = "eval/index.jsonl"
VALIDATION_NAME = "validation.json"


def build_manifest(
    *,
    name: str,
    version: str,
    created_at: str,
    source_uri: str,
    objects: Sequence[dict],
    tokenizer: dict,
    token_dtype: str,
    splits: dict,
    split_rule: dict,
    eval_records: int,
    slice_columns: Sequence[str],
    rows: dict,
    validation: dict,
    quarantine: dict | None = None,
    engine: str | None = None,
    task: str = TASK_CAUSAL_LM,
    labels: Sequence[str] | None = None,
) -> dict:
    """Assemble the manifest; ``splits`` maps each split to ``{"tokens", "shards"}``.

    ``engine`` (``"worker"`` or ``"spark"``) records what computed it; it is not part of
    the version, since either engine stages the same bytes.

    Shard paths are relative to the dataset version prefix. ``quarantine`` (the rows
    dropped, by reason, and the sample's path) is recorded only when quarantine was on.
    """
    missing = [s for s in SPLITS if s not in splits]
    if missing:
        raise ValueError(f"manifest for {name}/{version} lacks splits {missing}")
    for split in SPLITS:
        counted = sum(s["tokens"] for s in splits[split]["shards"])
        if counted != splits[split]["tokens"]:
            raise ValueError(
                f"split {split!r} claims {splits[split]['tokens']} tokens but its shards hold {counted}"
            )
    if rows["train"] + rows["eval"] != rows["total"]:
        raise ValueError(f"row counts do not add up: {rows}")
    manifest = {
        "format": MANIFEST_FORMAT,
        "name": name,
        "version": version,
        "created_at": created_at,
        "source": {"uri": source_uri, "objects": [dict(o) for o in objects]},
        "tokenizer": dict(tokenizer),
        "token_dtype": token_dtype,
        "splits": {
            s: {
                "tokens": int(splits[s]["tokens"]),
                "shards": [dict(x) for x in splits[s]["shards"]],
                **({"records": dict(splits[s]["records"])} if "records" in splits[s] else {}),
            }
            for s in SPLITS
        },
        "split_rule": dict(split_rule),
        "eval_index": {
            "path": EVAL_INDEX_PATH,
            "records": int(eval_records),
            "slice_columns": list(slice_columns),
        },
        "rows": {"total": int(rows["total"]), "train": int(rows["train"]), "eval": int(rows["eval"])},
        "validation": validation,
    }
    if quarantine is not None:
        manifest["quarantine"] = dict(quarantine)
    if task != TASK_CAUSAL_LM:
        manifest["task"] = {"kind": task, **({"labels": list(labels)} if labels is not None else {})}
    if engine is not None:
        manifest["engine"] = engine
    return manifest


def shard_paths(manifest: dict) -> list[str]:
    """Every file a manifest names, relative to the version prefix."""
    paths = [s["path"] for split in SPLITS for s in manifest["splits"][split]["shards"]]
    records = [manifest["splits"][s]["records"]["path"] for s in SPLITS if "records" in manifest["splits"][s]]
    return [*paths, *records, manifest["eval_index"]["path"]]


def check_manifest_name(manifest: object, name: str, uri: str) -> None:
    """Refuse (:class:`StagingError`, naming both) a manifest found in the folder computed for
    dataset ``name`` that records another dataset's name: trainops before #25 gave names such as
    ``fraud data`` and ``fraud_data`` one folder. A manifest that records no name is accepted."""
    recorded = manifest.get("name") if isinstance(manifest, dict) else None
    if recorded is None or recorded == name:
        return
    datasets, found, _ = uri.partition("/datasets/")
    try:
        home = (
            f"; it now stages {recorded!r} in {datasets}/datasets/{safe_segment(str(recorded))}/"
            if found
            else ""
        )
    except ValueError:
        home = ""
    raise StagingError(
        f"{uri} records dataset {recorded!r}, not {name!r}: this folder holds {recorded!r}'s versions "
        f"(trainops before #25 gave both names this folder{home}), so {name!r} may not use it; nothing "
        f"was staged. Give {name!r} another name, or move {recorded!r}'s versions out of this folder first"
    )
