"""Does the trainer's cost grow with a rank's share of the work, not with the whole model?

CPU, 2 processes (torchrun, gloo). Each figure is one function of :data:`FIGURES`; it runs
what it measures and returns ``name=value`` lines. Goals (issue #14):

- ``setup_peak_rss_ratio``: each rank's peak RSS during the trainer's ``setup`` (data, model
  built on the meta device and sharded, its shards materialised, optimizer, checkpointer),
  above the RSS it had before setup (the interpreter, torch and the process group: printed
  as ``setup_baseline_rss_mib``), over the bytes of its share of the model with AdamW's two
  moments (3 x fp32 x parameters / world size). The worst rank counts. Goal <= 1.5.
  ``setup_peak_rss_ratio_params`` divides by the parameters' share alone (the optimizer's
  moments do not exist yet after setup): a rank that held the whole model would show at least
  the world size here; ``setup_peak_rss_ratio_params_whole_model`` is that figure for a model
  built whole on every rank and then sharded (the path a user's ``model.builder`` takes).
- ``metrics_bytes_ratio_2n``: bytes rank 0's metrics writer (``trainer.metrics.MetricsLog``,
  driven directly, one process) stores over 2N steps over N steps, on ``file://`` and on S3
  (moto's server over HTTP), counted by a storage wrapper; the worse of the two counts. Goal
  <= 2.2. ``..._rewrite`` is the same figure for the previous version, which rewrote one
  ``metrics.jsonl`` whole at each flush (computed from the same parts: each flush would have
  written all parts so far); ``metrics_poll_bytes_ratio_2n`` is what one progress poll of the
  trigger reads at 2N steps over at N (a reader that has read everything up to the last flush).

    .venv/bin/python bench/scale.py [--preset small] [--only setup_peak_rss_ratio]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import env, torchrun, write_random_dataset

NPROC = 2
MIB = 2**20


def peak_rss_bytes() -> int:
    """This process's peak resident set so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def setup_worker(out_dir: Path, config_path: str) -> None:
    """One rank: the RSS before and after the trainer's setup, and its share of the model."""
    from trainer import parallel
    from trainer.attempts import Attempt, now_iso
    from trainer.config import load_config
    from trainer.contract import RunLayout
    from trainer.storage import open_storage
    from trainer.train import setup

    config = load_config(config_path)
    dist_env = parallel.init_distributed()
    storage, layout = open_storage(config.run_uri), RunLayout(config.run_uri)
    attempt = Attempt(storage, layout, 1, dist_env.world_size, started_at=now_iso())
    before = peak_rss_bytes()
    training = setup(config, dist_env, attempt)
    after = peak_rss_bytes()
    params = training.built.param_count
    (out_dir / f"setup_{dist_env.rank}.json").write_text(
        json.dumps({"before": before, "after": after, "params": params, "world": dist_env.world_size})
    )
    parallel.barrier()
    parallel.shutdown()


# The path a user's builder still takes (docs/models.md): the whole model on every rank's CPU.
WHOLE_MODEL_BUILDER = """
def build(vocab_size, seq_len):
    from trainer.model import Transformer
    from trainer.presets import PRESETS

    model = Transformer(PRESETS[{preset!r}].with_vocab(vocab_size))
    return model, list(model.layers)
"""


def measure_setup(tmp: Path, data_uri: str, name: str, model: dict) -> list[dict]:
    """Each rank's RSS before and after setup, for a run of ``model`` (config keys)."""
    config = tmp / f"{name}.json"  # JSON is YAML
    config.write_text(
        json.dumps(
            {
                "run_uri": (tmp / name).as_uri(),
                "data_uri": data_uri,
                "precision": "fp32",
                "model": model,
                "train": {"max_steps": 1, "micro_batch_size": 1, "seq_len": 64},
            }
        )
    )
    out = tmp / f"{name}_out"
    out.mkdir()
    environ = env(tmp / "cache")
    environ["PYTHONPATH"] = os.pathsep.join([str(tmp), environ["PYTHONPATH"]])
    torchrun([__file__, "--worker", "setup", str(out), str(config)], NPROC, environ)
    return [json.loads((out / f"setup_{r}.json").read_text()) for r in range(NPROC)]


def setup_peak_rss_ratio(tmp: Path, args: argparse.Namespace) -> list[str]:
    data_uri = write_random_dataset(tmp / "data", tokens=200_000)
    (tmp / "scale_whole_model.py").write_text(WHOLE_MODEL_BUILDER.format(preset=args.preset))
    sharded = measure_setup(tmp, data_uri, "sharded", {"preset": args.preset})
    whole = measure_setup(tmp, data_uri, "whole", {"builder": "scale_whole_model:build"})
    share_params = max(r["params"] * 4 / r["world"] for r in sharded)

    def grown(ranks: list[dict]) -> int:
        return max(r["after"] - r["before"] for r in ranks)

    return [
        f"setup_preset={args.preset} params={sharded[0]['params']} world_size={NPROC}",
        f"setup_baseline_rss_mib={max(r['before'] for r in sharded) / MIB:.0f}",
        f"setup_grown_rss_mib={grown(sharded) / MIB:.0f}",
        f"setup_share_mib={3 * share_params / MIB:.0f}",
        f"setup_peak_rss_ratio={grown(sharded) / (3 * share_params):.2f}",
        f"setup_peak_rss_ratio_params={grown(sharded) / share_params:.2f}",
        f"setup_peak_rss_ratio_params_whole_model={grown(whole) / share_params:.2f}",
    ]


METRICS_STEPS = 1000  # N; flushed every 10 steps (the default), so N steps write 100 parts
METRICS_FLUSH_EVERY = 10


class CountingStorage:
    """Hands each call used by the metrics writer and reader to ``inner``, counting bytes."""

    def __init__(self, inner):
        self.inner, self.written, self.read = inner, 0, 0

    def put(self, uri, data, **conditions):
        self.written += len(data)
        return self.inner.put(uri, data, **conditions)

    def get(self, uri):
        return self.get_with_etag(uri)[0]

    def get_with_etag(self, uri):
        body, etag = self.inner.get_with_etag(uri)
        self.read += len(body)
        return body, etag

    def head(self, uri):
        return self.inner.head(uri)

    def list(self, prefix_uri):
        return self.inner.list(prefix_uri)


def metrics_written(storage, run_uri: str, steps: int) -> tuple[int, list[int], int]:
    """(bytes stored, each part's size, bytes one progress poll then reads) for ``steps`` steps."""
    from trainer.contract import MetricsReader
    from trainer.metrics import MetricsLog

    counting = CountingStorage(storage)
    log = MetricsLog(counting, run_uri, attempt=1, flush_every=METRICS_FLUSH_EVERY)  # type: ignore[arg-type]
    poll = MetricsReader(counting, run_uri, attempt=1)
    for step in range(1, steps + 1):
        log.add(
            step=step,
            loss=2.0 + 1.0 / step,
            lr=3e-4,
            tokens_per_s=123456.7,
            time=1.7e9 + step,
            mfu=0.41,
            peak_mem_gib=61.2,
            checkpoint_blocked_s=0.0,  # another figure a record carries (issue #14)
        )
        if step == steps - METRICS_FLUSH_EVERY:
            poll.latest()  # the trigger polled at the flush before the last
    log.flush(final=True)
    before = counting.read
    poll.latest()
    sizes = [len(storage.get(u)) for u in storage.list(f"{run_uri}/metrics")]
    return counting.written, sizes, counting.read - before


def moto_root() -> tuple[object, str]:
    """A moto S3 server over HTTP on this machine with a fresh bucket; (server, root URI)."""
    import logging

    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    creds = {
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_REGION": "us-east-1",
        "AWS_ENDPOINT_URL_S3": f"http://{host}:{port}",
    }
    os.environ.update(creds)
    boto3.client(
        "s3",
        endpoint_url=creds["AWS_ENDPOINT_URL_S3"],
        region_name="us-east-1",
        aws_access_key_id="bench",
        aws_secret_access_key="bench",
    ).create_bucket(Bucket="bench")
    return server, "s3://bench/root"


def metrics_bytes_ratio_2n(tmp: Path, args: argparse.Namespace) -> list[str]:
    from trainer.storage import open_storage

    server, s3 = moto_root()
    lines, worst = [], 0.0
    try:
        for backend, root in (("file", tmp.as_uri()), ("s3", s3)):
            storage = open_storage(root)
            n, n_sizes, n_poll = metrics_written(storage, f"{root}/runs/n", METRICS_STEPS)
            two_n, two_n_sizes, two_n_poll = metrics_written(storage, f"{root}/runs/2n", 2 * METRICS_STEPS)

            def rewritten(sizes: list[int]) -> int:  # each flush rewrote everything so far
                return sum(sum(sizes[: i + 1]) for i in range(len(sizes)))

            worst = max(worst, two_n / n)
            lines += [
                f"metrics_{backend}_bytes_n={n} bytes_2n={two_n} parts_2n={len(two_n_sizes)} "
                f"steps_n={METRICS_STEPS} flush_every={METRICS_FLUSH_EVERY}",
                f"metrics_bytes_ratio_2n_{backend}={two_n / n:.3f}",
                f"metrics_bytes_ratio_2n_{backend}_rewrite={rewritten(two_n_sizes) / rewritten(n_sizes):.3f}",
                f"metrics_poll_bytes_ratio_2n_{backend}={two_n_poll / n_poll:.3f}",
            ]
    finally:
        server.stop()  # type: ignore[attr-defined]
    return [*lines, f"metrics_bytes_ratio_2n={worst:.3f}"]


FIGURES: dict[str, Callable[[Path, argparse.Namespace], list[str]]] = {
    "setup_peak_rss_ratio": setup_peak_rss_ratio,
    "metrics_bytes_ratio_2n": metrics_bytes_ratio_2n,
}
WORKERS: dict[str, Callable[[Path, str], None]] = {"setup": setup_worker}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        WORKERS[sys.argv[2]](Path(sys.argv[3]), sys.argv[4])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="small", help="model preset (default small: ~85M parameters)")
    parser.add_argument("--only", choices=sorted(FIGURES), action="append", help="figures to measure")
    args = parser.parse_args()
    for name in args.only or list(FIGURES):
        with tempfile.TemporaryDirectory(prefix=f"scale-{name}-") as tmp:
            for line in FIGURES[name](Path(tmp), args):
                print(line, flush=True)


if __name__ == "__main__":
    main()
