"""Parallelism applied from outside: ``parallelize`` wraps, compiles and shards a plain model from the
config; collectives in a world of one."""

import itertools

import pytest
import torch
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from trainer import parallel
from trainer.config import Config, TrainConfig
from trainer.models.llama import Transformer
from trainer.presets import ModelArgs

ARGS = ModelArgs(dim=32, n_layers=4, n_heads=4, vocab_size=97)
BLOCKS = [f"layers.{i}" for i in range(ARGS.n_layers)]


def plain_model() -> Transformer:
    torch.manual_seed(0)
    return Transformer(ARGS)


def test_checkpointed_blocks_per_mode():
    assert parallel.checkpointed_blocks("full", 4) == [0, 1, 2, 3]
    assert parallel.checkpointed_blocks("selective", 4) == [1, 3]
    assert parallel.checkpointed_blocks("none", 4) == []
    with pytest.raises(ValueError, match=r"must be none, full or selective, got 'some'"):
        parallel.checkpointed_blocks("some", 4)


def test_step_options_line_names_what_was_applied():
    assert parallel.describe_step_options("selective", 4, True, True) == (
        "activation checkpointing selective (blocks 1, 3 of 4), torch.compile per block, "
        "gradient sync on the last micro-step only"
    )
    assert parallel.describe_step_options("none", 4, False, False) == (
        "activation checkpointing none, gradient sync every micro-step"
    )


@pytest.mark.slow
def test_parallelize_checkpoints_then_compiles_then_shards(world_of_one):
    model = plain_model()
    config = Config(precision="fp32", train=TrainConfig(activation_checkpointing="selective", compile=True))
    assert parallel.parallelize(model, BLOCKS, config) is model

    wrapped = [isinstance(block, CheckpointWrapper) for block in model.layers]
    assert wrapped == [False, True, False, True]
    # compiled after wrapping: the compiled module is the wrapper itself, so its graph holds the recompute
    assert all(block._compiled_call_impl is not None for block in model.layers)
    assert isinstance(model, FSDPModule) and all(isinstance(block, FSDPModule) for block in model.layers)
    assert all(isinstance(p, DTensor) for p in model.parameters())
    assert set(model.state_dict()) == set(plain_model().state_dict())  # names as a plain model has them


def test_a_parallelized_model_computes_what_the_plain_one_does(world_of_one):
    tokens = torch.randint(0, 97, (2, 8))
    expected = plain_model()(tokens)
    model = parallel.parallelize(plain_model(), BLOCKS, Config(precision="fp32"))
    torch.testing.assert_close(model(tokens), expected, rtol=0, atol=1e-6)
    with pytest.raises(TypeError, match="needs an FSDP2-sharded model, got Transformer"):
        parallel.set_gradient_sync(plain_model(), False)


def test_an_unknown_precision_is_refused_before_the_model_is_touched(world_of_one):
    model = plain_model()
    with pytest.raises(ValueError, match=r"precision must be one of \['bf16', 'fp16', 'fp32'\], got 'int8'"):
        parallel.parallelize(
            model, BLOCKS, Config(precision="int8", train=TrainConfig(activation_checkpointing="full"))
        )
    assert not any(isinstance(block, CheckpointWrapper) for block in model.layers)


def test_only_fp16_gets_a_grad_scaler():
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    assert parallel.grad_scaler("bf16") is None and parallel.grad_scaler("fp32") is None
    assert isinstance(parallel.grad_scaler("fp16"), ShardedGradScaler)


def test_collectives_in_a_world_of_one(world_of_one):
    assert (world_of_one.rank, world_of_one.world_size, world_of_one.is_main) == (0, 1, True)
    assert parallel.broadcast_object({"step": 3}) == {"step": 3}
    assert parallel.all_reduce_sum([1.0, 2.5], world_of_one.device) == [1.0, 2.5]


def test_an_async_sum_on_the_host_group_returns_at_once_and_gives_the_sum_on_wait(world_of_one):
    import torch.distributed as dist

    group = parallel.host_group()
    # The world is gloo (CPU): it is the host group too, with no second gloo thread polling.
    assert dist.get_backend(group) == "gloo" and group is dist.group.WORLD
    pending = parallel.all_reduce_sum_async([1.0, 0.5], group)
    assert pending.wait() == [1.0, 0.5]
    tensor = torch.tensor([2.0, 3.0], dtype=torch.float64)
    assert parallel.sum_over_ranks(tensor) is tensor and tensor.tolist() == [2.0, 3.0]


# --- GPUs the node was given but this process cannot see ------------------------------------
@pytest.mark.parametrize(
    "expected, ranks, cuda, count, visible, missing",
    [
        (0, 2, False, 0, None, None),  # a CPU job: gloo on the CPU, as asked
        (2, 2, True, 2, "0,1", None),
        (1, 1, True, 8, None, None),  # more devices than ranks is fine
        (
            1,
            2,
            False,
            0,
            None,
            "TRAINOPS_GPUS_PER_NODE=1: this node's 2 rank(s) need 2 GPU(s), but this process sees no "
            "CUDA device (torch.cuda.is_available() is False), with CUDA_VISIBLE_DEVICES=unset; refusing "
            "to train on the CPU instead",
        ),
        (
            2,
            2,
            True,
            1,
            "3",
            "TRAINOPS_GPUS_PER_NODE=2: this node's 2 rank(s) need 2 GPU(s), but this process sees 1 CUDA "
            "device(s), with CUDA_VISIBLE_DEVICES='3'; refusing to train on the CPU instead",
        ),
    ],
)
def test_gpus_the_node_was_given_must_be_visible(expected, ranks, cuda, count, visible, missing):
    assert parallel.gpu_shortfall(expected, ranks, cuda, count, visible) == missing


def test_the_gpus_expected_come_from_the_launcher():
    assert parallel.gpus_expected({}) == 0 and parallel.gpus_expected({"TRAINOPS_GPUS_PER_NODE": " "}) == 0
    assert parallel.gpus_expected({"TRAINOPS_GPUS_PER_NODE": "8"}) == 8
    for bad in ("two", "-1", "1.5"):
        with pytest.raises(
            ValueError, match=rf"TRAINOPS_GPUS_PER_NODE='{bad}' is not a whole number of GPUs"
        ):
            parallel.gpus_expected({"TRAINOPS_GPUS_PER_NODE": bad})


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a host without CUDA")
def test_on_a_host_without_cuda_gpus_expected_fail_before_any_process_group(monkeypatch):
    import torch.distributed as dist

    from trainer.runtime.attempts import NODE_HINT, classify_failure

    monkeypatch.setenv("TRAINOPS_GPUS_PER_NODE", "1")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    with pytest.raises(
        parallel.GPUsMissing, match=r"sees no CUDA device .* CUDA_VISIBLE_DEVICES='0'"
    ) as missing:
        parallel.init_distributed()
    assert not dist.is_initialized()  # nothing joined, so nothing waits on this process
    assert classify_failure(missing.value) == ("node", NODE_HINT) and missing.value.cause == "node"


STALLED_PEER = """
import os, sys, time
import torch
import torch.distributed as dist
from trainer import parallel
from trainer.runtime.attempts import classify_failure
env = parallel.init_distributed(timeout_s=float(sys.argv[1]))
if env.rank == 1:  # joined, then never takes part: a stopped or hung rank
    time.sleep(float(sys.argv[2]))
    sys.exit(0)
started = time.monotonic()
try:
    dist.all_reduce(torch.ones(1))
except Exception as exc:
    print("waited", round(time.monotonic() - started, 1), "kind", classify_failure(exc)[0], flush=True)
print("nccl", os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING"), flush=True)
os._exit(0)
"""


@pytest.mark.slow
def test_a_collective_whose_peer_never_comes_fails_after_the_timeout_as_the_network(tmp_path):
    """gloo, two real processes: rank 1 joins the group and then stalls. Rank 0's all-reduce
    fails after the process-group timeout (2 s here, ``train.collective_timeout_s``, 600 s by
    default) instead of PyTorch's 30 min, and the failure is the network's (a retryable
    infrastructure cause)."""
    import os
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = tmp_path / "stalled.py"
    script.write_text(STALLED_PEER)
    base = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "2"}
    base.pop("TORCH_NCCL_ASYNC_ERROR_HANDLING", None)
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), "2", "20"],
            env={**base, "RANK": str(rank), "LOCAL_RANK": "0"},
            stdout=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    try:
        out, _ = procs[0].communicate(timeout=60)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    assert "kind network" in out, out
    waited = float(out.split("waited ")[1].split()[0])
    assert 1.5 <= waited < 15, out  # the 2 s timeout, not 30 min
    assert "nccl 1" in out  # the NCCL watchdog is on for a GPU group too


# --- initialisation on the meta device ------------------------------------------------------------
@pytest.mark.parametrize("shape", [(10, 3), (7,), (5, 2, 2)])
def test_any_cut_of_a_parameters_rows_fills_what_the_whole_tensor_holds(monkeypatch, shape):
    monkeypatch.setattr(parallel, "INIT_BLOCK_ELEMENTS", 4)  # several row blocks even at this size
    whole = torch.empty(shape)
    parallel.fill_rows(whole, shape, 0, 5, "w", 0.02)
    for cuts in ([0, 3, 10], [0, 4, 8, 10], [0, 1, 2, 9, 10], [0, 10]):
        rows = shape[0]
        bounds = [min(c, rows) for c in cuts]
        parts = []
        for lo, hi in itertools.pairwise(bounds):
            part = torch.empty((hi - lo, *shape[1:]))
            parallel.fill_rows(part, shape, lo, 5, "w", 0.02)
            parts.append(part)
        assert torch.equal(torch.cat(parts), whole)  # bit for bit, whatever the cut
    other = torch.empty(shape)
    parallel.fill_rows(other, shape, 0, 6, "w", 0.02)
    assert not torch.equal(other, whole)  # the seed decides the values...
    parallel.fill_rows(other, shape, 0, 5, "v", 0.02)
    assert not torch.equal(other, whole)  # ...and so does the name
    assert abs(whole.std().item() - 0.02) < 0.01


def test_a_model_sharded_on_meta_materialises_with_the_models_own_rule(world_of_one):
    with torch.device("meta"):
        model = Transformer(ARGS)
    parallel.parallelize(
        model, BLOCKS, Config(precision="fp32", train=TrainConfig(activation_checkpointing="full"))
    )
    assert all(p.is_meta for p in model.parameters())
    parallel.init_sharded(model, world_of_one.device, 3, model.init_std)
    full = {parallel.plain_name(n): p.full_tensor() for n, p in model.named_parameters()}
    assert not any(t.is_meta for t in full.values())
    assert torch.equal(full["norm.weight"], torch.ones(ARGS.dim))
    expected = torch.empty(ARGS.vocab_size, ARGS.dim)
    parallel.fill_rows(expected, tuple(expected.shape), 0, 3, "output.weight", 0.02)
    assert torch.equal(full["output.weight"], expected)  # under its name as built, not the wrapper's
    wo = full["layers.0.attention.wo.weight"]
    assert wo.std().item() == pytest.approx(0.02 / (2 * ARGS.n_layers) ** 0.5, rel=0.2)
    assert model(torch.randint(0, 97, (2, 8))).shape == (2, 8, 97)


def test_a_model_with_buffers_is_refused_before_anything_is_allocated(world_of_one):
    with torch.device("meta"):
        model = torch.nn.BatchNorm1d(4)
    with pytest.raises(TypeError, match=r"BatchNorm1d has buffers"):
        parallel.init_sharded(model, world_of_one.device, 0, lambda name: 0.02)


# --- HSDP ---------------------------------------------------------------------------------------
def test_flat_fsdp_needs_no_mesh_and_a_bad_replicate_fails_before_any_mesh(world_of_one):
    assert parallel.device_mesh(world_of_one, "auto") is None
    assert parallel.device_mesh(world_of_one, "1") is None
    assert parallel.describe_mesh(None, 4) == "FSDP over all 4 ranks"
    from trainer.config import ConfigError

    with pytest.raises(ConfigError, match=r"parallel.replicate=2 does not divide the world size 1"):
        parallel.device_mesh(world_of_one, "2")


INIT_PROBE = """
import sys, torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from trainer import parallel
from trainer.config import Config, ModelConfig, ParallelConfig
from trainer.train import build_sharded_model

env = parallel.init_distributed()
config = Config(seed=5, model=ModelConfig(preset="tiny"), parallel=ParallelConfig(replicate=sys.argv[2]))
mesh = parallel.device_mesh(env, config.parallel.replicate)
built = build_sharded_model(config, env, 257, mesh)
full = get_model_state_dict(built.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
if env.rank == 0:
    torch.save({"weights": full, "mesh": str(mesh)}, sys.argv[1])
parallel.shutdown()
"""


@pytest.mark.slow
def test_initial_weights_do_not_depend_on_the_world_size_or_the_mesh(tmp_path):
    """The trainer's setup path (meta device, sharded, each rank filling its shards) on 1 rank,
    2 ranks flat and 4 ranks in HSDP (2 replicas x 2): the same full weights, bit for bit."""
    import subprocess
    import sys

    from tests.trainer.helpers import REPO, trainer_env

    script = tmp_path / "init_probe.py"
    script.write_text(INIT_PROBE)
    runs = {}
    for nproc, replicate in ((1, "1"), (2, "1"), (4, "2")):
        out = tmp_path / f"w{nproc}.pt"
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                f"--nproc-per-node={nproc}",
                str(script),
                str(out),
                replicate,
            ],
            env=trainer_env(tmp_path / "cache"),
            capture_output=True,
            text=True,
            timeout=120,
            cwd=REPO,
        )
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        runs[nproc] = torch.load(out)
    assert "replicate" in runs[4]["mesh"] and runs[2]["mesh"] == "None"
    one = runs[1]["weights"]
    for nproc in (2, 4):
        assert set(runs[nproc]["weights"]) == set(one)
        for name, tensor in one.items():
            assert torch.equal(runs[nproc]["weights"][name], tensor), (nproc, name)


@pytest.mark.slow
def test_hsdp_gradients_on_2_nodes_of_2_ranks_match_one_unsharded_process(tmp_path):
    """4 gloo ranks as 2 "nodes" x 2 processes (parallel.replicate=2): shards within a replica,
    gradients averaged across replicas, the same first-step gradients as one plain process."""
    import subprocess
    import sys

    from tests.trainer import grad_probe
    from tests.trainer.helpers import REPO, trainer_env

    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node=4",
            str(REPO / "tests" / "trainer" / "grad_probe.py"),
            str(tmp_path),
            *grad_probe.HSDP_CASES,
        ],
        env=trainer_env(tmp_path / "cache"),
        capture_output=True,
        text=True,
        timeout=180,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    reference = grad_probe.reference_gradients()
    for name in grad_probe.HSDP_CASES:
        result = torch.load(tmp_path / f"{name}.pt")
        assert result["mesh"] == (2, 2), name  # really 2 replicas of 2 shards
        assert set(result["grads"]) == set(reference)
        worst = max(((result["grads"][k] - ref).norm() / ref.norm()).item() for k, ref in reference.items())
        assert worst < 1e-5, name  # fp32: summation order only
        assert result["losses"][-1] < result["losses"][0] - 0.25, name
