"""Helpers for the trainer tests: a small, learnable byte-token dataset and trainer launch lines."""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import yaml

from trainer.contract import TORCHRUN_ENV
from trainer.storage import Storage

EOS = 256
SOURCES = ("news", "wiki", "forum")
SUBJECTS = ("the cat", "a dog", "the old man", "my sister", "the robot", "our teacher")
VERBS = ("eats", "sees", "likes", "paints", "finds", "carries")
OBJECTS = ("an apple", "the moon", "a red box", "some bread", "the river", "a small boat")


def sentences(count: int, seed: int) -> list[tuple[str, str]]:
    """(source, text) records from a few templates: repetitive enough to learn in seconds."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        source = rng.choice(SOURCES)
        words = [
            f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)}."
            for _ in range(rng.randint(1, 3))
        ]
        out.append((source, f"[{source}] " + " ".join(words)))
    return out


def encode(text: str) -> list[int]:
    return [*list(text.encode("utf-8")), EOS]


def write_shards(root: Path, split: str, tokens: np.ndarray, shard_tokens: int) -> list[dict]:
    (root / split).mkdir(parents=True, exist_ok=True)
    shards = []
    for number, start in enumerate(range(0, len(tokens), shard_tokens)):
        chunk = tokens[start : start + shard_tokens].astype("<u2")
        rel = f"{split}/{number:05d}.bin"
        (root / rel).write_bytes(chunk.tobytes())
        shards.append(
            {"path": rel, "tokens": len(chunk), "sha256": hashlib.sha256(chunk.tobytes()).hexdigest()}
        )
    return shards


def write_dataset(
    root: Path,
    *,
    train_records: int = 1500,
    eval_records: int = 120,
    shard_tokens: int = 20000,
    seed: int = 0,
) -> str:
    """A staged dataset version folder (manifest, shards, eval index); returns its file:// URI."""
    root.mkdir(parents=True, exist_ok=True)
    train = [t for r in sentences(train_records, seed) for t in encode(r[1])]
    eval_rows = sentences(eval_records, seed + 1)
    eval_tokens, index = [], []
    for number, (source, text) in enumerate(eval_rows):
        start = len(eval_tokens)
        eval_tokens += encode(text)
        index.append({"id": f"e{number}", "source": source, "start": start, "end": len(eval_tokens)})
    (root / "eval").mkdir(parents=True, exist_ok=True)
    (root / "eval" / "index.jsonl").write_text("".join(json.dumps(r) + "\n" for r in index))
    manifest = {
        "format": "trainops.dataset/v1",
        "name": "demo",
        "version": "test",
        "tokenizer": {"kind": "byte", "vocab_size": 257, "eos_id": EOS},
        "token_dtype": "uint16",
        "splits": {
            "train": {
                "tokens": len(train),
                "shards": write_shards(root, "train", np.array(train), shard_tokens),
            },
            "eval": {
                "tokens": len(eval_tokens),
                "shards": write_shards(root, "eval", np.array(eval_tokens), shard_tokens),
            },
        },
        "eval_index": {"path": "eval/index.jsonl", "records": len(index), "slice_columns": ["source"]},
        "rows": {"total": train_records + eval_records, "train": train_records, "eval": eval_records},
    }
    (root / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return root.as_uri()


def write_config(path: Path, **values) -> Path:
    """A YAML config file holding ``values`` (sections as nested dicts)."""
    path.write_text(yaml.safe_dump(values, sort_keys=False))
    return path


def instructions(count: int, seed: int) -> list[tuple[str, str]]:
    """(prompt, response) records: a question about a templated sentence and its answer, the
    answer learnable from the prompt."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        subject, verb, obj = rng.choice(SUBJECTS), rng.choice(VERBS), rng.choice(OBJECTS)
        out.append((f"Q: who {verb} {obj}? ({subject} {verb} {obj}.)\nA:", f" {subject}."))
    return out


def write_records(root: Path, split: str, rows: list[tuple[int, int, int]]) -> dict:
    """A record task's ``<split>/records.bin`` (trainer.contract.tasks) and its manifest entry."""
    data = np.array(rows, dtype="<i8").reshape(-1, 3).tobytes()
    (root / split).mkdir(parents=True, exist_ok=True)
    (root / split / "records.bin").write_bytes(data)
    return {"path": f"{split}/records.bin", "count": len(rows), "sha256": hashlib.sha256(data).hexdigest()}


def write_sft_dataset(
    root: Path, *, train_records: int = 600, eval_records: int = 60, shard_tokens: int = 20000, seed: int = 0
) -> str:
    """A staged ``sft`` dataset version (prompt/response records, byte tokens); its file:// URI."""
    root.mkdir(parents=True, exist_ok=True)
    splits = {}
    for split, count, offset in (("train", train_records, 0), ("eval", eval_records, 1)):
        tokens: list[int] = []
        rows = []
        for prompt, response in instructions(count, seed + offset):
            start, prompt_tokens = len(tokens), list(prompt.encode("utf-8"))
            tokens += prompt_tokens + encode(response)
            rows.append((start, len(tokens) - start, len(prompt_tokens)))
        splits[split] = {
            "tokens": len(tokens),
            "shards": write_shards(root, split, np.array(tokens), shard_tokens),
            "records": write_records(root, split, rows),
        }
    manifest = {
        "format": "trainops.dataset/v1",
        "name": "instructions",
        "version": "test",
        "task": {"kind": "sft"},
        "tokenizer": {"kind": "byte", "vocab_size": 257, "eos_id": EOS},
        "token_dtype": "uint16",
        "splits": splits,
        "rows": {"total": train_records + eval_records, "train": train_records, "eval": eval_records},
    }
    (root / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return root.as_uri()


# What a sentence's first subject is: the label of the classification dataset.
KINDS = {"the cat": "animal", "a dog": "animal", "the robot": "machine"}
LABELS = ["animal", "machine", "person"]


def labelled(count: int, seed: int) -> list[tuple[str, str, str]]:
    """(source, text, label) records: the templated sentences without their ``[source]`` tag,
    labelled by the kind of their first subject (``KINDS``, else ``person``)."""
    out = []
    for source, text in sentences(count, seed):
        body = text.split("] ", 1)[1]
        subject = next(s for s in SUBJECTS if body.startswith(s))
        out.append((source, body, KINDS.get(subject, "person")))
    return out


def write_classification_dataset(
    root: Path, *, train_records: int = 600, eval_records: int = 60, shard_tokens: int = 20000, seed: int = 0
) -> str:
    """A staged ``classification`` dataset version (text/label records, byte tokens, the label
    set ``LABELS``, an eval index sliced by source); its file:// URI."""
    root.mkdir(parents=True, exist_ok=True)
    splits, index = {}, []
    for split, count, offset in (("train", train_records, 0), ("eval", eval_records, 1)):
        tokens: list[int] = []
        rows = []
        for number, (source, text, label) in enumerate(labelled(count, seed + offset)):
            start = len(tokens)
            tokens += encode(text)
            rows.append((start, len(tokens) - start, LABELS.index(label)))
            if split == "eval":
                index.append({"id": f"e{number}", "source": source, "start": start, "end": len(tokens)})
        splits[split] = {
            "tokens": len(tokens),
            "shards": write_shards(root, split, np.array(tokens), shard_tokens),
            "records": write_records(root, split, rows),
        }
    (root / "eval" / "index.jsonl").write_text("".join(json.dumps(r) + "\n" for r in index))
    manifest = {
        "format": "trainops.dataset/v1",
        "name": "kinds",
        "version": "test",
        "task": {"kind": "classification", "labels": LABELS},
        "tokenizer": {"kind": "byte", "vocab_size": 257, "eos_id": EOS},
        "token_dtype": "uint16",
        "splits": splits,
        "eval_index": {"path": "eval/index.jsonl", "records": len(index), "slice_columns": ["source"]},
        "rows": {"total": train_records + eval_records, "train": train_records, "eval": eval_records},
    }
    (root / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return root.as_uri()


# A tiny BERT as its config.json would hold it (model.hf_config), for the byte tokenizer (its
# padding id 0 is a byte no text holds). Dropout stays on, as in BERT: resume must replay it.
TINY_BERT = {
    "model_type": "bert",
    "vocab_size": 257,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "max_position_embeddings": 128,
    "pad_token_id": 0,
}


# A tiny Qwen2 as its config.json would hold it (model.hf_config), with tied embeddings (the LM
# head is the embedding, as in Qwen2-0.5B), for the test dataset's byte tokenizer.
TINY_QWEN2 = {
    "model_type": "qwen2",
    "vocab_size": 257,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
    "tie_word_embeddings": True,
}


# --- running the trainer ------------------------------------------------------------------
REPO = Path(__file__).resolve().parents[2]

# Small enough to finish in seconds on 2 CPU cores, long enough (~0.1 s a step) for a
# signal sent after step 13 to land well before step 40.
TRAIN_KEYS = {
    "seed": 7,
    "precision": "bf16",
    "model": {"preset": "tiny"},
    # 16 samples a step: 2 accumulation steps on 2 ranks, 4 on one (elastic resume).
    "train": {
        "max_steps": 40,
        "micro_batch_size": 4,
        "global_batch_size": 16,
        "seq_len": 32,
        "lr": 3.0e-3,
        "warmup_steps": 5,
        "log_every": 10,
    },
    "checkpoint": {"every_steps": 10, "keep": 2},
    "metrics": {"flush_every": 1},
}


GLOBAL_BATCH = 16


def trainer_env(cache: Path, attempt: int | None = None, **test_env: str) -> dict:
    """The environment a launcher gives the trainer: this checkout importable, a cache, an attempt."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("TRAINOPS_", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_"))
    }
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["TRAINOPS_CACHE_DIR"] = str(cache)
    env["OMP_NUM_THREADS"] = "1"
    env.update(TORCHRUN_ENV)  # as every launcher sets it for torchrun
    if attempt is not None:
        env["TRAINOPS_ATTEMPT"] = str(attempt)
    env.update(
        {f"TRAINOPS_TEST_{k.upper()}": v for k, v in test_env.items()}
    )  # see tests/trainer/instrumented.py
    return env


# The trainer's entry point with the test instruments (tests/trainer/instrumented.py).
INSTRUMENTED = "tests.trainer.instrumented"


def torchrun_argv(
    config: Path, *overrides: str, nproc: int = 2, module: str = "trainer", max_restarts: int = 0
) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        f"--max-restarts={max_restarts}",
        "-m",
        module,
        "train",
        "--config",
        str(config),
        *overrides,
    ]


def single_process_argv(config: Path, *overrides: str, module: str = "trainer") -> list[str]:
    return [sys.executable, "-m", module, "train", "--config", str(config), *overrides]


def samples_read(folder: Path, attempt: int) -> list[dict]:
    """Every micro-batch the instrumented trainer read in ``attempt``, all ranks, in cursor order."""
    records = []
    for path in sorted(folder.glob(f"samples_a{attempt}_r*.jsonl")):
        records += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return sorted(records, key=lambda r: (r["cursor"], r["micro"], r["positions"][0]))


def run_config(tmp_path: Path, dataset_uri: str, name: str, **extra) -> tuple[Path, str]:
    """A config file for a fresh run folder; returns (config path, run_uri)."""
    run_dir = tmp_path / name
    values = {"run_uri": run_dir.as_uri(), "data_uri": dataset_uri, **TRAIN_KEYS, **extra}
    return write_config(tmp_path / f"{name}.yaml", **values), run_dir.as_uri()


# --- reading what a run left ----------------------------------------------------------------
def read_json(path: Path) -> dict:
    return json.loads(path.read_text())


def metrics_of(run_dir: Path) -> dict[int, dict]:
    from trainer.contract import MetricsReader, metrics_by_step
    from trainer.storage import open_storage

    return metrics_by_step(MetricsReader(open_storage(run_dir.as_uri()), run_dir.as_uri()).records())


def committed_steps(run_dir: Path) -> list[int]:
    folder = run_dir / "checkpoints"
    return (
        sorted(int(p.name[5:]) for p in folder.glob("step_*") if (p / "_COMMITTED").exists())
        if folder.exists()
        else []
    )


# --- storage in between -------------------------------------------------------------------------
class ForwardingStorage(Storage):
    """A storage that hands every primitive to ``inner``: subclass it to fail or interleave chosen
    calls (an outage, a rival writer), with everything else real."""

    def __init__(self, inner: Storage):
        self.inner = inner

    def before(self, action: str, uri: str) -> None:
        """Called before each primitive with what it does (read, write, ...) and its URI."""

    def put(self, uri, data, *, if_none_match=False, if_match=None):
        self.before("write", uri)
        return self.inner.put(uri, data, if_none_match=if_none_match, if_match=if_match)

    def get_with_etag(self, uri):
        self.before("read", uri)
        return self.inner.get_with_etag(uri)

    def head(self, uri):
        self.before("head", uri)
        return self.inner.head(uri)

    def list(self, prefix_uri):
        self.before("list", prefix_uri)
        return self.inner.list(prefix_uri)

    def delete(self, uri):
        self.before("delete", uri)
        return self.inner.delete(uri)

    def delete_prefix(self, prefix_uri):
        self.before("delete", prefix_uri)
        return self.inner.delete_prefix(prefix_uri)

    def upload_file(self, local_path, uri, *, move=False):
        self.before("upload", uri)
        return self.inner.upload_file(local_path, uri, move=move)

    def download_file(self, uri, local_path):
        self.before("download", uri)
        return self.inner.download_file(uri, local_path)

    def copy(self, src_uri, dst_uri):
        self.before("copy", src_uri)
        return self.inner.copy(src_uri, dst_uri)


class CountingDownloads(ForwardingStorage):
    """Records the URI of every file downloaded through it (``downloads``)."""

    def __init__(self, inner):
        super().__init__(inner)
        self.downloads: list[str] = []

    def download_file_hashed(self, uri, local_path):
        self.downloads.append(uri)
        return self.inner.download_file_hashed(uri, local_path)


def preempted_then_killed(
    config: Path, run: Path, tmp_path: Path, overrides: tuple[str, ...], global_batch: int = GLOBAL_BATCH
) -> dict:
    """Three attempts of a 12-step run checkpointed every 4 steps, under torchrun with the test
    instruments: SIGTERM inside step 2 (it stops after step 3, checkpointed), then killed
    (SIGKILL, the whole gang) while held in step 9 after the step-8 commit, then to the end.
    Returns the attempt records of 1 and 3 (2 was killed: it has none).

    :param run: the run folder ``config`` names."""
    held = tmp_path / "held"
    held.mkdir()

    def cursor_before(step: int) -> int:
        return (step - 1) * global_batch

    def train(attempt: int, **instruments: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            torchrun_argv(config, *overrides, module=INSTRUMENTED),
            env=trainer_env(tmp_path / "cache", attempt, **instruments),
            capture_output=True,
            text=True,
            timeout=300,
        )

    first = train(1, sigterm_at=f"{cursor_before(2)}:1")
    assert first.returncode == 1, first.stdout[-3000:] + first.stderr[-3000:]  # torchrun's, on SIGTERM
    proc = subprocess.Popen(
        torchrun_argv(config, *overrides, module=INSTRUMENTED),
        env=trainer_env(tmp_path / "cache", 2, pause_at=f"{cursor_before(10)}:{held}"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 180
        while not (len(list(held.glob("paused_a2_r*"))) == 2 and 8 in committed_steps(run)):
            assert proc.poll() is None, "attempt 2 ended before it was held"
            assert time.monotonic() < deadline, "attempt 2 was never held after the step-8 commit"
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    assert not (run / "attempts" / "2.json").exists()  # killed: no record
    third = train(3)
    assert third.returncode == 0, third.stdout[-3000:] + third.stderr[-3000:]
    return {1: read_json(run / "attempts" / "1.json"), 3: read_json(run / "attempts" / "3.json")}
