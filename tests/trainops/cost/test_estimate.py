"""The estimate before launch: steps x expected step time x price, checked against hand-computed
figures."""

from __future__ import annotations

import pytest

from trainer.config import config_from_mapping
from trainops.cost import estimate as est
from trainops.cost.prices import default_table

# A small price table in the contract's shape: USD per instance-hour of 8 GPUs, so 1.50 and
# 4.00 per GPU-hour.
PRICES = {
    "p4d.24xlarge": {
        "spot": {"per_hour": 12.0, "gpus": 8, "source": "test spot price", "date": "2026-12-01"},
        "on-demand": {"per_hour": 32.0, "gpus": 8, "source": "test list price", "date": "2026-12-01"},
    }
}
RUN = "file:///root/runs/retrain_manual/manual__1/train"


def config(model=None, **train):
    return config_from_mapping(
        {"run_uri": "file:///r", "data_uri": "file:///d", "model": model or {"preset": "1b"}, "train": train}
    )


def test_the_estimate_from_the_presets_flops_is_the_hand_computed_one():
    # 1b (TinyLlama's shape: dim 2048, 22 layers, 32 heads, 4 kv heads, ffn 5632), a 32,000-token
    # vocabulary: per block 2048*2048*2 + 2048*256*2 (attention) + 3*2048*5632 (SwiGLU) + 2*2048
    # (norms) = 44,044,288; N = 22 blocks + the output projection 32,000*2048 + the final norm
    # = 1,034,512,384 non-embedding parameters. FLOPs per token at seq_len 2048:
    # 6 N + 12 * 22 * 2048 * 2048 = 6,207,074,304 + 1,107,296,256 = 7,314,370,560.
    cfg = config(max_steps=1000, seq_len=2048, micro_batch_size=4)
    estimate = est.estimate_run(
        cfg, nodes=2, gpus_per_node=8, capacity="spot", prices=PRICES, instance_type="p4d.24xlarge"
    )
    tokens_per_step = 4 * 16 * 2048  # micro-batch x 16 ranks x seq_len = 131,072
    step_s = tokens_per_step * 7_314_370_560 / (0.4 * 312e12 * 16)  # at 40% MFU of 16 A100s (bf16)
    assert estimate["step_s"] == pytest.approx(step_s) == pytest.approx(0.48012, rel=1e-4)
    gpu_hours = 1000 * step_s / 3600 * 16  # 2.1339
    assert (estimate["hours"], estimate["gpu_hours"]) == (
        pytest.approx(1000 * step_s / 3600),
        pytest.approx(gpu_hours),
    )
    assert estimate["spot_cost"] == pytest.approx(gpu_hours * 1.5) == pytest.approx(3.2009, rel=1e-4)
    assert estimate["on_demand_cost"] == pytest.approx(gpu_hours * 4.0) == pytest.approx(8.5358, rel=1e-4)
    assert estimate["savings"] == pytest.approx(gpu_hours * 2.5)
    assert (estimate["step_time_source"], estimate["gpu"], estimate["accelerators"]) == (
        "preset FLOPs",
        "A100",
        16,
    )
    assert (estimate["format"], estimate["estimate"], estimate["currency"]) == (
        "trainops.estimate/v1",
        True,
        "USD",
    )
    said = "\n".join(estimate["assumptions"])
    assert "assumed 40% MFU of 16 x A100 (312 TFLOP/s bf16 dense peak" in said
    assert "7.314e+09 per token, counted with a 32,000-token vocabulary" in said
    assert (
        "spot: $1.50/GPU-hour (test spot price)" in said
        and "on-demand: $4.00/GPU-hour (test list price)" in said
    )

    lines = est.estimate_lines(estimate)
    assert lines[:3] == [
        "COST ESTIMATE (before launch; every figure is an estimate, in USD):",
        "  1,000 steps x 0.48 s/step (preset FLOPs) = 8 min on 16 accelerators (p4d.24xlarge), capacity spot"
        " = 2.13 GPU-hours",
        "  spot $3.20, on-demand $8.54: spot saves $5.33 (62%) if no preemption comes",
    ]


def test_a_set_mfu_and_global_batch_change_the_step_time_as_the_formula_says():
    cfg = config(max_steps=10, seq_len=2048, micro_batch_size=4, global_batch_size=128)
    half = est.estimate_run(
        cfg, nodes=2, gpus_per_node=8, capacity="spot", prices=PRICES, instance_type="p4d.24xlarge", mfu=0.2
    )
    assert half["step_s"] == pytest.approx(128 * 2048 * 7_314_370_560 / (0.2 * 312e12 * 16))
    assert "assumed 20% MFU" in "\n".join(half["assumptions"])
    with pytest.raises(ValueError, match=r"assumed MFU must be a fraction in \(0, 1\], got 1\.5"):
        est.estimate_run(cfg, nodes=1, gpus_per_node=8, capacity="spot", prices=PRICES, mfu=1.5)
    with pytest.raises(ValueError, match=r"got 0"):
        est.flops_step_s(tokens_per_step=1, flops_per_token=1.0, peak=1.0, devices=1, mfu=0)


def test_an_unknown_gpu_says_the_peak_is_unknown_and_what_was_assumed():
    cfg = config(max_steps=1000, seq_len=2048, micro_batch_size=4)
    estimate = est.estimate_run(
        cfg, nodes=2, gpus_per_node=8, capacity="spot-then-on-demand", prices=PRICES, instance_type="p9.fake"
    )
    said = estimate["assumptions"]
    assert (
        "peak FLOP/s unknown for p9.fake (not in the table of instance types): assumed an A100's 312 TFLOP/s "
        "bf16; name the instance type (node selector node.kubernetes.io/instance-type) for a better figure"
    ) in said
    # priced at the contract's per-GPU-hour default, and said so
    assert (
        estimate["spot_price"]["known"] is False
        and "unknown instance type p9.fake" in estimate["spot_price"]["source"]
    )
    assert any(line.startswith("spot: $") and "unknown instance type p9.fake" in line for line in said)
    # the same step time as on the A100s it assumed
    assert estimate["step_s"] == pytest.approx(131_072 * 7_314_370_560 / (0.4 * 312e12 * 16))
    assert estimate["gpu"] == "A100" and estimate["capacity"] == "spot-then-on-demand"
    lines = "\n".join(est.estimate_lines(estimate))
    assert "peak FLOP/s unknown for p9.fake" in lines and "capacity spot-then-on-demand" in lines


def test_cpu_nodes_of_no_known_type_assume_the_reference_peak_and_a_node_per_accelerator():
    estimate = est.estimate_run(
        config(model={"preset": "tiny"}), nodes=2, gpus_per_node=0, capacity="spot", prices=PRICES
    )
    assert estimate["accelerators"] == 2 and estimate["instance_type"] is None
    said = estimate["assumptions"]
    assert said[0].startswith("peak FLOP/s unknown for CPU nodes of unknown instance type: assumed an A100's")
    assert "CPU nodes: each node is priced as one accelerator" in said
    assert estimate["spot_price"]["source"] == "default per-GPU-hour (no instance type known)"


def test_fp32_uses_the_fp32_peak():
    cfg = config_from_mapping(
        {"run_uri": "r", "data_uri": "d", "precision": "fp32", "model": {"preset": "small"}}
    )
    estimate = est.estimate_run(
        cfg, nodes=1, gpus_per_node=8, capacity="spot", prices=PRICES, instance_type="p5.48xlarge"
    )
    assert estimate["gpu"] == "H100" and "67 TFLOP/s fp32" in "\n".join(estimate["assumptions"])


def test_a_builder_model_without_an_earlier_run_has_no_step_time_and_says_why():
    cfg = config(model={"builder": "custom_model:build"})
    estimate = est.estimate_run(cfg, nodes=1, gpus_per_node=8, capacity="spot", prices=PRICES)
    assert (estimate["step_s"], estimate["spot_cost"], estimate["savings"], estimate["step_time_source"]) == (
        None,
        None,
        None,
        "none",
    )
    lines = est.estimate_lines(estimate)
    assert (
        lines[1]
        == "  100 steps on 8 accelerators (instance type unknown), capacity spot: no step time, so no cost"
    )
    assert (
        "no step time: model.builder 'custom_model:build' has no FLOPs count before it is built" in lines[2]
    )


def test_a_gpu_count_that_disagrees_with_the_instance_type_is_said():
    estimate = est.estimate_run(
        config(), nodes=1, gpus_per_node=8, capacity="spot", prices=PRICES, instance_type="g5.xlarge"
    )
    assert (
        "gpus_per_node=8, but a g5.xlarge has 1 GPU: the estimate counts 8 per node"
        in estimate["assumptions"][0]
    )


# ----------------------------------------------------------------------- a measured step time


def records(attempt, first, last, start, stalls=None):
    """Steps ``first..last`` of ``attempt``, 2 s each from ``start``; ``stalls[step]`` more seconds after that step."""
    out, t = [], start
    for step in range(first, last + 1):
        t += 2.0
        out.append({"step": step, "attempt": attempt, "loss": 1.0, "time": t})
        t += (stalls or {}).get(step, 0.0)
    return out


def test_the_measured_step_time_is_over_kept_steps_without_each_attempts_first_step():
    # attempt 1: steps 1..30 (a 3 s checkpoint stall after 20), preempted; steps 21..30 are lost
    # and attempt 2 trains them again, 100 s later, then 31..40. Kept: 1..20 of attempt 1 (19
    # intervals, 38 s), 21..40 of attempt 2 (19 intervals, 38 s): the stall after step 20 falls
    # between attempts, attempt 2's startup before its first step, so neither counts.
    metrics = records(1, 1, 30, 1000.0, {20: 3.0}) + records(2, 21, 40, 1200.0)
    assert est.kept_step_s(metrics) == (pytest.approx(2.0), 38)
    # the highest attempt's record of a step wins, in any order
    assert est.kept_step_s(metrics[::-1]) == (pytest.approx(2.0), 38)
    # a stall inside a run of kept steps counts: the new run will stall as often
    assert est.kept_step_s(records(1, 1, 11, 0.0, {5: 10.0})) == (pytest.approx(30 / 10), 10)
    assert est.kept_step_s(records(1, 1, 1, 0.0)) is None and est.kept_step_s([]) is None


def test_a_measured_step_time_wins_and_is_scaled_to_the_new_shape():
    earlier = config(max_steps=500, seq_len=2048, micro_batch_size=4)
    measured = est.measure_run(
        run_uri=RUN,
        config=earlier,
        nodes=1,
        gpus_per_node=8,
        instance_type="p4d.24xlarge",
        records=records(1, 1, 50, 0.0),
    )
    assert measured == {
        "run_uri": RUN,
        "step_s": pytest.approx(2.0),
        "steps": 49,
        "accelerators": 8,
        "tokens_per_step": 4 * 8 * 2048,
        "flops_per_token": pytest.approx(7_314_370_560),
        "instance_type": "p4d.24xlarge",
    }
    same = est.estimate_run(
        earlier,
        nodes=1,
        gpus_per_node=8,
        capacity="spot",
        prices=PRICES,
        instance_type="p4d.24xlarge",
        measured=measured,
    )
    assert (same["step_s"], same["step_time_source"]) == (pytest.approx(2.0), "previous run")
    assert same["gpu_hours"] == pytest.approx(500 * 2.0 / 3600 * 8) and same["spot_cost"] == pytest.approx(
        500 * 2 / 3600 * 8 * 1.5
    )
    assert same["assumptions"][0] == (
        f"step time measured over 49 kept steps of the last run of this DAG and model, {RUN}: 2 s/step on 8 accelerators"
    )
    assert not any("scaled" in line for line in same["assumptions"])
    # twice the nodes, the same micro-batch: twice the tokens per step over twice the GPUs
    wider = est.estimate_run(
        earlier, nodes=2, gpus_per_node=8, capacity="spot", prices=PRICES, measured=measured
    )
    assert wider["step_s"] == pytest.approx(2.0)
    # a fixed global batch over twice the GPUs: half the work per GPU
    fixed = config(max_steps=500, seq_len=2048, micro_batch_size=4, global_batch_size=32)
    halved = est.estimate_run(
        fixed, nodes=2, gpus_per_node=8, capacity="spot", prices=PRICES, measured=measured
    )
    assert halved["step_s"] == pytest.approx(1.0)
    assert "scaled by 0.5 to this run's work per step and 16 accelerators" in halved["assumptions"][1]
    other = est.estimate_run(
        earlier,
        nodes=1,
        gpus_per_node=8,
        capacity="spot",
        prices=PRICES,
        instance_type="p5.48xlarge",
        measured=measured,
    )
    assert "that run ran on p4d.24xlarge, this one asks for p5.48xlarge" in "\n".join(other["assumptions"])


def test_same_model_compares_the_builder_or_else_the_preset():
    assert est.same_model(config(), config(max_steps=7))
    assert not est.same_model(config(), config(model={"preset": "tiny"}))
    assert est.same_model(
        config(model={"builder": "m:f"}), config(model={"builder": "m:f", "preset": "tiny"})
    )
    assert not est.same_model(config(model={"builder": "m:f"}), config())


# ----------------------------------------------------------------------- the tables


def test_every_gpu_of_an_instance_type_has_its_peak_in_every_precision():
    assert {gpu for gpu, _ in est.INSTANCE_GPUS.values()} <= set(est.PEAK_FLOPS)
    assert all(peak > 0 for peaks in est.PEAK_FLOPS.values() for peak in peaks.values())


def test_every_instance_type_the_shipped_prices_know_has_its_gpu_and_count_here():
    for instance_type, capacities in default_table().items():
        known = est.gpu_of(instance_type)
        assert known is not None, instance_type
        assert {price["gpus"] for price in capacities.values()} == {known[1]}, instance_type
    assert est.gpu_of("standard_nd96isr_h100_v5") == ("H100", 8)  # Azure names ignore case
