"""An export with production's weights is recognised, reading bytes only when sizes agree."""

import pytest

from trainer.contract import join, model_version_prefix
from trainer.storage import open_storage
from trainops.registry.identity import compare_with_production, weight_sizes, weights_sha256
from trainops.registry.promotion import promote

WEIGHTS = b"\x00\x01" * 500


def export(root: str, run: str, weights: bytes, config: bytes = b'{"dim": 64}') -> str:
    storage = open_storage(root)
    uri = join(root, "runs", "retrain", run, "train", "export")
    storage.put(join(uri, "model.safetensors"), weights)
    storage.put(join(uri, "config.json"), config)
    return uri


def production_from(root: str, weights: bytes, run: str = "run-1") -> str:
    storage = open_storage(root)
    uri = export(root, run, weights)
    card = {"run_uri": join(root, "runs", "retrain", run, "train")}
    promote(storage, root, "m", export_uri=uri, card=card, expected_production_version=None)
    return uri


def compare(root: str, export_uri: str, run_uri: str | None = "file:///elsewhere"):
    return compare_with_production(open_storage(root), root, "m", export_uri=export_uri, run_uri=run_uri)


def test_the_same_weights_are_identical_to_production_with_their_digest(file_root):
    production_from(file_root, WEIGHTS)
    # a different config.json beside the same weights is still the same model's weights
    candidate = export(file_root, "run-2", WEIGHTS, config=b'{"dim": 64, "note": "retrained"}')
    found = compare(file_root, candidate)
    digest = weights_sha256(open_storage(file_root), candidate, ["model.safetensors"])
    assert found == {"version": 1, "identical": True, "weights_sha256": digest}
    assert len(digest) == 64


def test_one_changed_byte_is_a_different_model(file_root):
    production_from(file_root, WEIGHTS)
    changed = WEIGHTS[:-1] + b"\x02"
    found = compare(file_root, export(file_root, "run-2", changed))
    assert found is not None and found["identical"] is False
    assert found["weights_sha256"] is not None  # same sizes: read and hashed, kept for its card


def test_different_sizes_decide_without_reading_a_byte(file_root, monkeypatch):
    production_from(file_root, WEIGHTS)
    candidate = export(file_root, "run-2", WEIGHTS + b"\x00\x00")
    storage = open_storage(file_root)
    monkeypatch.setattr(type(storage), "download_file_hashed", lambda *a: pytest.fail("read bytes"))
    assert compare_with_production(storage, file_root, "m", export_uri=candidate, run_uri=None) == {
        "version": 1,
        "identical": False,
        "weights_sha256": None,
    }


def test_a_digest_in_productions_card_is_used_instead_of_reading_production(file_root):
    storage = open_storage(file_root)
    production_from(file_root, WEIGHTS)
    candidate = export(file_root, "run-2", WEIGHTS)
    card_uri = join(model_version_prefix(file_root, "m", 1), "card.json")
    card = storage.get_json(card_uri)
    storage.put_json(card_uri, {**card, "weights_sha256": "0" * 64})  # what the card says wins
    assert compare(file_root, candidate)["identical"] is False


def test_no_production_or_productions_own_run_is_not_compared(file_root):
    assert compare(file_root, export(file_root, "run-1", WEIGHTS)) is None  # nothing promoted yet
    uri = production_from(file_root, WEIGHTS)
    own_run = join(file_root, "runs", "retrain", "run-1", "train")
    assert compare(file_root, uri, run_uri=own_run) is None  # a retry: promote reports it


def test_weight_files_are_the_safetensors_ones():
    files = [
        {"path": "model-00001-of-00002.safetensors", "size": 10},
        {"path": "model-00002-of-00002.safetensors", "size": 4},
        {"path": "model.safetensors.index.json", "size": 99},
        {"path": "tokenizer.json", "size": 5},
    ]
    assert weight_sizes(files) == {
        "model-00001-of-00002.safetensors": 10,
        "model-00002-of-00002.safetensors": 4,
    }
