"""A promoted version serves as it is: only ``transformers``, reading the version folder.

The demo data is staged (great-expectations, the byte tokenizer), a tiny model trains for 40
steps in one process, ``trainer evaluate`` scores it, and the registry promotes it. Then
``AutoTokenizer``, ``AutoModelForCausalLM`` and ``pipeline("text-generation")`` load the
promoted folder; the model's loss on the held-out split, over the windows trainer evaluate
uses, matches trainops' evaluation within 1e-3; and the tokenizer encodes every demo row as
staging did. It takes seconds: 1,000 demo rows, the tests' 40-step training config.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.trainer.helpers import TRAIN_KEYS, trainer_env
from trainer.contract import RunLayout, join
from trainer.storage import open_storage

pytestmark = pytest.mark.slow

DEMO_ROWS = 1000


def _trainer(command: str, config: Path, cache: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "trainer", command, "--config", str(config)],
        env=trainer_env(cache, attempt=1),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


@pytest.fixture(scope="module")
def promoted(tmp_path_factory) -> dict:
    """Stage the demo data, train, evaluate and promote: the version folder and what trainops said."""
    from trainops.gate.checks import decide
    from trainops.registry.card import build_card
    from trainops.registry.promotion import promote
    from trainops.staging.demo_data import write_demo_dataset
    from trainops.staging.stage import stage_dataset

    tmp = tmp_path_factory.mktemp("servable")
    root = (tmp / "storage").as_uri()
    storage = open_storage(root)
    source = write_demo_dataset(join(root, "raw", "demo"), rows=DEMO_ROWS)
    staged = stage_dataset(storage, root, source["uri"], "demo-text")
    run_uri = join(root, "runs", "servable", "train")
    layout = RunLayout(run_uri)
    config_path = Path(layout.config.removeprefix("file://"))
    config_path.parent.mkdir(parents=True)
    config_path.write_text(yaml.safe_dump({"run_uri": run_uri, "data_uri": staged["uri"], **TRAIN_KEYS}))
    _trainer("train", config_path, tmp / "cache")
    _trainer("evaluate", config_path, tmp / "cache")
    evaluation = storage.get_json(layout.eval_metrics)
    checks = [{"kind": "threshold", "metric": "eval_loss", "op": "<=", "value": 6.0}]
    card = build_card(
        storage,
        gate=decide(checks, evaluation["candidate"], None),
        training={"run_uri": run_uri, "config_uri": layout.config, "steps": TRAIN_KEYS["train"]["max_steps"]},
        dataset=staged,
        evaluation={"candidate": evaluation["candidate"], "production": None},
    )
    result = promote(
        storage, root, "demo-lm", export_uri=layout.export, card=card, expected_production_version=None
    )
    return {
        "folder": Path(result["version_uri"].removeprefix("file://")),
        "evaluation": evaluation,
        "dataset": Path(staged["uri"].removeprefix("file://")),
        "rows": source,
        "seq_len": TRAIN_KEYS["train"]["seq_len"],
    }


def test_the_version_folder_holds_a_servable_hugging_face_layout(promoted):
    names = sorted(p.name for p in promoted["folder"].iterdir())
    assert names == [
        "README.md",
        "_claim.json",
        "card.json",
        "config.json",
        "export.json",
        "generation_config.json",
        "model.safetensors",
        "model_config.json",
        "special_tokens_map.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    config = json.loads((promoted["folder"] / "config.json").read_text())
    assert (config["bos_token_id"], config["eos_token_id"], config["torch_dtype"]) == (256, 256, "bfloat16")
    readme = (promoted["folder"] / "README.md").read_text()
    assert readme.startswith("---\nlibrary_name: transformers\n") and "# demo-lm v1" in readme


def test_transformers_loads_generates_and_scores_held_out_text_as_trainops_did(promoted):
    import torch
    import torch.nn.functional as F
    from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline

    folder = str(promoted["folder"])
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()

    generate = pipeline("text-generation", model=model, tokenizer=tokenizer, device="cpu")
    out = generate("the council", max_new_tokens=12, do_sample=False)[0]["generated_text"]
    assert out.startswith("the council") and len(out) > len("the council")

    # The held-out split scored over trainer evaluate's windows: seq_len + 1 tokens that share
    # only their boundary token, so every token but the first is predicted once.
    seq_len = promoted["seq_len"]
    manifest = json.loads((promoted["dataset"] / "manifest.json").read_text())
    tokens = np.concatenate(
        [
            np.fromfile(promoted["dataset"] / s["path"], dtype="<u2")
            for s in manifest["splits"]["eval"]["shards"]
        ]
    ).astype(np.int64)
    windows = [(a, min(a + seq_len + 1, len(tokens))) for a in range(0, len(tokens) - 1, seq_len)]
    full = [w for w in windows if w[1] - w[0] == seq_len + 1]
    batches = [full, *[[w] for w in windows if w not in full]]  # one forward pass per window length
    total, count = 0.0, 0
    with torch.no_grad():
        for batch in batches:
            window = torch.from_numpy(np.stack([tokens[a:b] for a, b in batch]))
            logits = model(window[:, :-1]).logits.float()
            loss = F.cross_entropy(logits.transpose(1, 2), window[:, 1:], reduction="sum")
            total, count = total + float(loss), count + window[:, 1:].numel()
    candidate = promoted["evaluation"]["candidate"]
    assert count == candidate["tokens"]
    assert abs(total / count - candidate["eval_loss"]) < 1e-3, (total / count, candidate["eval_loss"])
    assert candidate["eval_loss"] < 5.0  # it learnt something: ln(257) = 5.55 untrained


def test_the_tokenizer_encodes_every_demo_row_as_staging_did(promoted):
    import pyarrow.parquet as pq
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(promoted["folder"]))
    dataset = promoted["dataset"]
    manifest = json.loads((dataset / "manifest.json").read_text())
    rows = pq.read_table([f.removeprefix("file://") for f in promoted["rows"]["files"]]).to_pylist()
    text_of = {row["id"]: row["text"] for row in rows}

    def staged(split: str) -> np.ndarray:
        shards = manifest["splits"][split]["shards"]
        return np.concatenate([np.fromfile(dataset / s["path"], dtype="<u2") for s in shards]).astype(
            np.int64
        )

    def record(text: str) -> list[int]:
        # what staging stores per record: the text's tokens, then EOS (docs/promotion.md)
        ids = tokenizer(text, add_special_tokens=False).input_ids
        assert tokenizer.encode(text) == ids == list(text.encode("utf-8"))
        return [*ids, tokenizer.eos_token_id]

    eval_tokens = staged("eval")
    index = [json.loads(line) for line in (dataset / "eval" / "index.jsonl").read_text().splitlines()]
    for entry in index:
        assert record(text_of[entry["id"]]) == eval_tokens[entry["start"] : entry["end"]].tolist()
    eval_ids = {entry["id"] for entry in index}
    train = [tok for row in rows if row["id"] not in eval_ids for tok in record(row["text"])]
    assert train == staged("train").tolist()
    assert len(index) + sum(row["id"] not in eval_ids for row in rows) == len(rows) == DEMO_ROWS
