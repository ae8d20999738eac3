"""Is a candidate the production model already? The same weights, byte for byte.

Retraining on the same data with the same config and seed trains the same weights (resumes are
bitwise exact), as when the demo runs twice. Publishing them again would add a version that
differs from production only in its number, and move the pointer for nothing. So promotion
compares first: when every weight file (``*.safetensors``) of the candidate's export has the
name and size of one in the production version, both sides' sha256 are computed (one file at a
time through a temporary file) and compared. Differing sizes decide without reading a byte. A
version's card keeps its ``weights_sha256`` once computed, so the next comparison reads one
side only.

``weights_sha256`` is the sha256 of the lines ``<path> <file sha256>`` of the weight files in
path order: for one ``model.safetensors``, a digest of that file's digest.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Iterable, Mapping
from typing import Any

from trainer.contract import join
from trainer.storage import NotFound, Storage
from trainops.registry.pointer import read_production

__all__ = ["WEIGHT_SUFFIX", "compare_with_production", "weight_sizes", "weights_sha256"]

WEIGHT_SUFFIX = ".safetensors"


def weight_sizes(files: Iterable[Mapping[str, Any]]) -> dict[str, int | None]:
    """``{path: size}`` of the weight files among ``files`` (``{"path", "size"}`` records)."""
    return {f["path"]: f.get("size") for f in files if str(f["path"]).endswith(WEIGHT_SUFFIX)}


def _listing(storage: Storage, base_uri: str) -> list[dict[str, Any]]:
    base = base_uri.rstrip("/")
    return [
        {"path": uri[len(base) + 1 :], "size": (storage.head(uri) or {}).get("size")}
        for uri in storage.list(base)
    ]


def weights_sha256(storage: Storage, base_uri: str, paths: Iterable[str]) -> str:
    """The combined digest of the weight files ``paths`` under ``base_uri`` (module docstring)."""
    combined = hashlib.sha256()
    with tempfile.TemporaryDirectory(prefix="trainops-weights-") as scratch:
        local = os.path.join(scratch, "file")
        for path in sorted(paths):
            _, digest = storage.download_file_hashed(join(base_uri, path), local)
            os.unlink(local)
            combined.update(f"{path} {digest}\n".encode())
    return combined.hexdigest()


def compare_with_production(
    storage: Storage, root: str, name: str, *, export_uri: str, run_uri: str | None
) -> dict[str, Any] | None:
    """Compare the export at ``export_uri`` with the production version of ``name``:
    ``{"version", "identical", "weights_sha256"}``, the last being the candidate's digest when
    it was computed (None when sizes decided). None when there is no production yet, or when
    production came from ``run_uri`` itself (a retried promotion, which
    :func:`trainops.registry.promotion.promote` reports as the promotion it was)."""
    pointer = read_production(storage, root, name)
    if pointer is None or (run_uri is not None and pointer.get("run_uri") == run_uri):
        return None
    version_uri = pointer["uri"]
    try:
        card = storage.get_json(join(version_uri, "card.json"))
    except NotFound:
        card = {}
    card = card if isinstance(card, dict) else {}
    theirs = weight_sizes(card.get("files") or _listing(storage, version_uri))
    ours = weight_sizes(_listing(storage, export_uri))
    different = {"version": pointer["version"], "identical": False, "weights_sha256": None}
    if not ours or ours != theirs or None in ours.values():
        return different
    candidate = weights_sha256(storage, export_uri, ours)
    production = card.get("weights_sha256") or weights_sha256(storage, version_uri, theirs)
    return {**different, "identical": candidate == production, "weights_sha256": candidate}
