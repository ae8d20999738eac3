import pytest

from trainer.flops import flops_per_token, mfu, peak_flops
from trainer.presets import PRESETS, non_embedding_params


def test_flops_per_token_is_six_n_plus_palm_attention_term():
    # 6 * 1e9 + 12 * 24 * 2048 * 4096 = 6e9 + 2,415,919,104
    assert flops_per_token(1_000_000_000, 24, 2048, 4096) == 8_415_919_104


def test_7b_at_4k_context_matches_the_hand_count():
    args = PRESETS["7b"]
    n = non_embedding_params(args)
    assert n == 6_607_343_616  # 6.74B minus the 32000 x 4096 input embedding
    assert flops_per_token(n, 32, 4096, 4096) == pytest.approx(6 * n + 12 * 32 * 4096 * 4096)
    assert flops_per_token(n, 32, 4096, 4096) / 1e9 == pytest.approx(46.09, abs=0.01)


def test_mfu_on_known_numbers():
    # 3,000 tok/s on a 7B-class model (46.09 GFLOP/token) = 138.3 TFLOP/s of an H100's 989.
    per_token = flops_per_token(6_607_343_616, 32, 4096, 4096)
    assert mfu(3000, per_token, peak_flops("NVIDIA H100 80GB HBM3", "bf16")) == pytest.approx(
        0.1398, abs=1e-4
    )
    assert mfu(1000, 1e9, 1e12 * 8) == pytest.approx(0.125)  # a job's tokens over 8 devices' peak
    assert mfu(1000, 1e9, None) is None


@pytest.mark.parametrize(
    "name, dtype, peak",
    [
        ("NVIDIA H100 80GB HBM3", "bf16", 989e12),
        ("NVIDIA H200", "bf16", 989e12),
        ("NVIDIA H100 PCIe", "bf16", 756e12),
        ("NVIDIA A100-SXM4-80GB", "bf16", 312e12),
        ("NVIDIA A100-SXM4-40GB", "fp32", 19.5e12),
        ("NVIDIA L4", "fp16", 121e12),
        ("NVIDIA L40S", "bf16", 362e12),
        ("NVIDIA A10G", "bf16", 125e12),
        ("cpu", "bf16", None),
        (None, "fp32", None),
        ("Tesla T4", "fp16", None),
    ],
)
def test_peak_flops_by_device_name(name, dtype, peak):
    assert peak_flops(name, dtype) == peak


def test_bad_inputs_name_the_value():
    with pytest.raises(ValueError, match="dtype must be one of bf16, fp16, fp32, got 'int8'"):
        peak_flops("NVIDIA H100", "int8")
    with pytest.raises(ValueError, match="seq_len must not be negative, got -1"):
        flops_per_token(10, 1, 1, -1)
    with pytest.raises(ValueError, match="peak FLOP/s must be positive, got 0"):
        mfu(1.0, 1.0, 0)
