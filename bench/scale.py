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
- ``blocking_steps``: the longest the training loop waited for one async checkpoint, the wait
  for a previous save still in flight included (each checkpoint step's ``checkpoint_blocked_s``
  in the run's metrics), over the median step time of the same run, for the real trainer
  saving to ``s3://`` on moto's server over HTTP every ``--every-steps`` steps. Goal <= 1.
  ``blocking_save_steps`` is a whole save (staging, writing, upload, commit) over the median
  step: below that many steps between saves the loop waits for the previous one, whatever the
  staging costs.
- ``metrics_bytes_ratio_2n``: bytes rank 0's metrics writer (``trainer.runtime.metrics.MetricsLog``,
  driven directly, one process) stores over 2N steps over N steps, on ``file://`` and on S3
  (moto's server over HTTP), counted by a storage wrapper; the worse of the two counts. Goal
  <= 2.2. ``..._rewrite`` is the same figure for the previous version, which rewrote one
  ``metrics.jsonl`` whole at each flush (computed from the same parts: each flush would have
  written all parts so far); ``metrics_poll_bytes_ratio_2n`` is what one progress poll of the
  trigger reads at 2N steps over at N (a reader that has read everything up to the last flush).

- ``resume_bytes_ratio``: the bytes storage sent during one resume (the trainer's ``setup`` of
  a second attempt, which loads the checkpoint the first one committed), all ranks together,
  over the checkpoint's size (its ``_COMMITTED`` sizes). Storage is ``s3://`` on moto's server,
  behind a TCP relay in this process that counts every byte the server sends to the ranks
  (:class:`CountingRelay`: response headers, listings and ``HEAD`` replies included, so the
  figure can only err high); the dataset stays on ``file://``. Each rank has a node cache of
  its own, as on 2 nodes of 1 rank, where a rank that fetched the whole checkpoint would show
  the world size. ``resume_bytes_ratio_1node`` is the same resume on 1 node of 2 ranks (one
  cache). Goal <= 1.1.
- ``data_bytes_ratio``: the bytes storage sent while 2 ranks of one node set up a run whose
  dataset is on ``s3://`` (moto, the same counting relay; the run on ``file://``), over the
  train split's size: every shard is fetched once per node. Goal <= 1.1.

    .venv/bin/python bench/scale.py [--preset small] [--resume-preset tiny] [--every-steps 16] [--only NAME]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import resource
import socket
import socketserver
import statistics
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, env, torchrun, write_random_dataset
from checkpoint import moto_s3, save_blocking

NPROC = 2
MIB = 2**20


def peak_rss_bytes() -> int:
    """This process's peak resident set so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def setup_worker(out_dir: Path, config_path: str) -> None:
    """One rank: the RSS before and after the trainer's setup, and its share of the model."""
    from trainer import parallel
    from trainer.config import load_config
    from trainer.contract import RunLayout
    from trainer.runtime.attempts import Attempt, now_iso
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
    from trainer.models.llama import Transformer
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


class CountingRelay:
    """A TCP relay on 127.0.0.1 in front of an HTTP server, counting the bytes the server sends.

    Every byte relayed from the server to a client counts (headers included), so a figure over
    it errs high, never low; :meth:`reset` starts the count over.
    """

    def __init__(self, upstream: tuple[str, int]):
        self.upstream, self.sent = upstream, 0
        self._lock = threading.Lock()
        relay = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                with socket.create_connection(relay.upstream) as server:
                    back = threading.Thread(
                        target=relay._pump, args=(server, self.request, True), daemon=True
                    )
                    back.start()
                    relay._pump(self.request, server, False)
                    back.join()

        self._server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def _pump(self, src: socket.socket, dst: socket.socket, counted: bool) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(1 << 16):
                dst.sendall(data)
                if counted:
                    with self._lock:
                        self.sent += len(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def reset(self) -> None:
        with self._lock:
            self.sent = 0

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@contextlib.contextmanager
def counted_s3(environ: dict) -> Iterator[tuple[CountingRelay, str]]:
    """moto's S3 server behind a :class:`CountingRelay`, with a bucket; ``environ`` (and this
    process's environment) point the S3 client at the relay. Yields the relay and the bucket's URI."""
    import logging

    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # a line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    relay = CountingRelay(server.get_host_and_port())
    creds = {
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_REGION": "us-east-1",
        "AWS_ENDPOINT_URL_S3": relay.url,
    }
    environ.update(creds)
    os.environ.update(creds)
    boto3.client(
        "s3",
        endpoint_url=relay.url,
        region_name="us-east-1",
        aws_access_key_id="bench",
        aws_secret_access_key="bench",
    ).create_bucket(Bucket="bench")
    try:
        yield relay, "s3://bench"
    finally:
        relay.close()
        server.stop()


ENV_RANKS_PER_NODE = "SCALE_RANKS_PER_NODE"


def _node_cache_of_this_rank() -> None:
    """Give this rank the cache of its simulated node: ``$TRAINOPS_CACHE_DIR/node<n>``."""
    per_node = int(os.environ.get(ENV_RANKS_PER_NODE, "0"))
    if per_node:
        from trainer.contract import ENV_CACHE_DIR

        node = int(os.environ["RANK"]) // per_node
        os.environ[ENV_CACHE_DIR] = str(Path(os.environ[ENV_CACHE_DIR]) / f"node{node}")


def attempt_worker(out_dir: Path, config_path: str) -> None:
    """One rank of one attempt: the trainer's setup (a resume when a checkpoint exists), then a
    synchronous checkpoint when ``out_dir`` has a ``save`` file."""
    _node_cache_of_this_rank()
    from trainer import parallel
    from trainer.config import load_config
    from trainer.contract import RunLayout
    from trainer.runtime.attempts import Attempt, now_iso
    from trainer.storage import open_storage
    from trainer.train import setup

    config = load_config(config_path)
    dist_env = parallel.init_distributed()
    storage, layout = open_storage(config.run_uri), RunLayout(config.run_uri)
    number = int(os.environ.get("TRAINOPS_ATTEMPT", "1"))
    training = setup(
        config, dist_env, Attempt(storage, layout, number, dist_env.world_size, started_at=now_iso())
    )
    if (out_dir / "save").exists():
        training.state.step = 1  # as if it had trained a step: the resume must report it
        training.checkpointer.save(1)
    (out_dir / f"attempt_{dist_env.rank}.json").write_text(json.dumps({"step": training.state.step}))
    parallel.barrier()
    parallel.shutdown()


def run_attempt(
    tmp: Path, name: str, config: dict, environ: dict, *, save: bool, per_node: int
) -> list[dict]:
    """One attempt of ``config`` on 2 ranks, ``per_node`` of them per simulated node."""
    path = tmp / f"{name}.json"  # JSON is YAML
    path.write_text(json.dumps(config))
    out = tmp / f"{name}_out"
    out.mkdir()
    if save:
        (out / "save").touch()
    torchrun(
        [__file__, "--worker", "attempt", str(out), str(path)],
        NPROC,
        {**environ, ENV_RANKS_PER_NODE: str(per_node), "TRAINOPS_ATTEMPT": "2" if not save else "1"},
    )
    return [json.loads((out / f"attempt_{r}.json").read_text()) for r in range(NPROC)]


def run_config(run_uri: str, data_uri: str, preset: str, vocab_size: int = 0) -> dict:
    return {
        "run_uri": run_uri,
        "data_uri": data_uri,
        "precision": "fp32",
        "model": {"preset": preset, "vocab_size": vocab_size},
        "train": {"max_steps": 4, "micro_batch_size": 1, "seq_len": 64},
    }


def resume_bytes_ratio(tmp: Path, args: argparse.Namespace) -> list[str]:
    from trainer.checkpoint.files import find_latest
    from trainer.contract import RunLayout
    from trainer.storage import open_storage

    data_uri = write_random_dataset(tmp / "data", tokens=200_000)
    environ = env(tmp / "cache")
    lines = []
    with counted_s3(environ) as (relay, bucket):
        for figure, per_node in (("resume_bytes_ratio", 1), ("resume_bytes_ratio_1node", NPROC)):
            run_uri = f"{bucket}/{figure}"
            config = run_config(run_uri, data_uri, args.resume_preset, args.resume_vocab)
            run_attempt(tmp, f"{figure}_save", config, environ, save=True, per_node=per_node)
            relay.reset()
            resumed = run_attempt(tmp, f"{figure}_resume", config, environ, save=False, per_node=per_node)
            fetched = relay.sent
            found = find_latest(open_storage(run_uri), RunLayout(run_uri))
            assert found is not None and all(r["step"] == 1 for r in resumed), resumed
            size = sum(entry["size"] for entry in found[1]["files"])
            if per_node == 1:
                lines.append(
                    f"resume_preset={args.resume_preset} vocab={args.resume_vocab} checkpoint_bytes={size} "
                    f"files={len(found[1]['files'])} world_size={NPROC}"
                )
            lines += [f"{figure}_fetched_bytes={fetched}", f"{figure}={fetched / size:.3f}"]
    return lines


def data_bytes_ratio(tmp: Path, args: argparse.Namespace) -> list[str]:
    from trainer.storage import open_storage

    local = write_random_dataset(tmp / "data", tokens=2_000_000)
    environ = env(tmp / "cache")
    with counted_s3(environ) as (relay, bucket):
        data_uri = f"{bucket}/datasets/bench/v1"
        store = open_storage(data_uri)
        root = Path(local.removeprefix("file://"))
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            store.upload_file(path, f"{data_uri}/{path.relative_to(root).as_posix()}")
        manifest = json.loads((root / "manifest.json").read_text())
        size = sum((root / shard["path"]).stat().st_size for shard in manifest["splits"]["train"]["shards"])
        relay.reset()
        config = run_config((tmp / "run").as_uri(), data_uri, "tiny")
        run_attempt(tmp, "data", config, environ, save=False, per_node=NPROC)
        fetched = relay.sent
    return [
        f"data_train_bytes={size} ranks_per_node={NPROC}",
        f"data_fetched_bytes_per_node={fetched}",
        f"data_bytes_ratio={fetched / size:.3f}",
    ]


SAVED = re.compile(r"checkpoint: step (\d+) staged in [0-9.]+s .*; committed in ([0-9.]+)s$", re.M)


def blocking_steps(tmp: Path, args: argparse.Namespace) -> list[str]:
    """The trainer on 2 ranks, 2 async saves to S3 (moto over HTTP), then its final one."""
    from trainer.contract import MetricsReader, metrics_by_step
    from trainer.storage import open_storage

    data_uri = write_random_dataset(tmp / "data", tokens=200_000)
    every, saves = args.every_steps, 2
    with moto_s3() as (root, creds):
        run_uri = f"{root}/runs/blocking"
        config = tmp / "blocking.json"  # JSON is YAML
        config.write_text(
            json.dumps(
                {
                    "run_uri": run_uri,
                    "data_uri": data_uri,
                    "seed": 1,
                    "precision": "fp32",
                    "resume": "never",
                    "model": {"preset": args.preset},
                    "train": {"max_steps": every * saves + 1, "micro_batch_size": 1, "seq_len": 64},
                    "checkpoint": {"every_steps": every, "keep": 2},
                    # metrics reach storage at the end: the loop's steps time training and saves
                    "metrics": {"flush_every": every * saves + 1},
                }
            )
        )
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={NPROC}"]
        proc = subprocess.run(
            [*cmd, "-m", "trainer", "train", "--config", str(config)],
            env={**env(tmp / "cache"), **creds},
            capture_output=True,
            text=True,
            timeout=1800,
            cwd=REPO,
        )
        if proc.returncode != 0:
            raise RuntimeError(
                f"the trainer failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
            )
        by_step = metrics_by_step(MetricsReader(open_storage(run_uri), run_uri).records())
    blocking = save_blocking([by_step[step] for step in sorted(by_step)])
    whole = [float(s) for _, s in SAVED.findall(proc.stdout + proc.stderr)]
    save_s = statistics.median(whole)
    return [
        f"blocking_preset={args.preset} world_size={NPROC} every_steps={every} saves={len(blocking['blocked_s'])} "
        "storage=s3 (moto over HTTP)",
        f"blocking_step_s={blocking['step_s']:.3f}",
        f"blocking_worst_blocked_s={max(blocking['blocked_s']):.3f}",
        f"blocking_worst_waited_s={max(blocking['waited_for_previous_s']):.3f}",
        f"blocking_worst_staged_s={max(blocking['staged_s']):.3f}",
        f"blocking_staged_s={' '.join(f'{s:.3f}' for s in blocking['staged_s'])}",
        f"blocking_save_s={save_s:.2f}",
        f"blocking_save_steps={save_s / blocking['step_s']:.2f}",
        f"blocking_steps={blocking['blocking_steps']:.3f}",
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
    from trainer.runtime.metrics import MetricsLog

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


def metrics_bytes_ratio_2n(tmp: Path, args: argparse.Namespace) -> list[str]:
    from trainer.storage import open_storage

    lines, worst = [], 0.0
    with counted_s3({}) as (_relay, bucket):
        s3 = f"{bucket}/root"
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
    return [*lines, f"metrics_bytes_ratio_2n={worst:.3f}"]


FIGURES: dict[str, Callable[[Path, argparse.Namespace], list[str]]] = {
    "setup_peak_rss_ratio": setup_peak_rss_ratio,
    "resume_bytes_ratio": resume_bytes_ratio,
    "data_bytes_ratio": data_bytes_ratio,
    "blocking_steps": blocking_steps,
    "metrics_bytes_ratio_2n": metrics_bytes_ratio_2n,
}
WORKERS: dict[str, Callable[[Path, str], None]] = {"setup": setup_worker, "attempt": attempt_worker}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        WORKERS[sys.argv[2]](Path(sys.argv[3]), sys.argv[4])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="small", help="model preset (default small: ~85M parameters)")
    parser.add_argument("--resume-preset", default="tiny", help="model preset of the resume figure")
    parser.add_argument(
        "--resume-vocab", type=int, default=16384, help="its vocabulary (default 16384: a ~25 MB checkpoint)"
    )
    parser.add_argument("--only", choices=sorted(FIGURES), action="append", help="figures to measure")
    parser.add_argument(
        "--every-steps",
        type=int,
        default=16,
        help="checkpoint.every_steps for blocking_steps (default 16: moto takes a `small` checkpoint in "
        "about 8 steps of 2 CPU ranks)",
    )
    args = parser.parse_args()
    for name in args.only or list(FIGURES):
        with tempfile.TemporaryDirectory(prefix=f"scale-{name}-") as tmp:
            for line in FIGURES[name](Path(tmp), args):
                print(line, flush=True)


if __name__ == "__main__":
    main()
