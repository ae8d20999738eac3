"""Model FLOPs utilization (MFU): plain arithmetic, no torch.

FLOPs per trained token follow the PaLM paper's appendix B convention::

    6 * N  +  12 * n_layers * dim * seq_len

``6 * N`` is the forward (2 N) and backward (4 N) matmul work of the ``N`` non-embedding
parameters. The second term is self-attention's own matmuls (scores ``QK^T`` and the
weighted sum of values), forward and backward, per token at context ``seq_len``. Like PaLM
it ignores causal masking (a kernel that skips masked blocks does half of that work) and
does not count activation recomputation, so MFU does not rise when checkpointing adds work.

MFU = tokens/s * FLOPs per token / peak FLOP/s of the devices that produced those tokens.
"""

from __future__ import annotations

import re

# Dense (not 2:4-sparse) tensor-core peaks per GPU from NVIDIA's datasheets, by compute
# dtype. fp32 means plain fp32 (torch leaves TF32 off for matmuls by default). The first
# pattern that matches ``torch.cuda.get_device_name()`` wins, so specific names come first.
PEAK_FLOPS: list[tuple[str, dict[str, float]]] = [
    (r"H100.*PCIe", {"bf16": 756e12, "fp16": 756e12, "fp32": 51e12}),
    (r"H200|H100|H800|GH200", {"bf16": 989e12, "fp16": 989e12, "fp32": 67e12}),  # SXM
    (r"A100|A800", {"bf16": 312e12, "fp16": 312e12, "fp32": 19.5e12}),
    (r"L40S", {"bf16": 362e12, "fp16": 362e12, "fp32": 91.6e12}),
    (r"\bL4\b", {"bf16": 121e12, "fp16": 121e12, "fp32": 30.3e12}),  # datasheet: 242 with sparsity
    # The A10 datasheet's figure (250 with sparsity). AWS publishes none for its A10G; measured
    # bf16 matmuls there reach ~70 TFLOP/s, so treat A10G MFU as a lower bound.
    (r"A10G?\b", {"bf16": 125e12, "fp16": 125e12, "fp32": 31.2e12}),
]
DTYPES = ("bf16", "fp16", "fp32")


def flops_per_token(n_params_non_embedding: int, n_layers: int, dim: int, seq_len: int) -> float:
    """Training FLOPs (forward + backward) per token: ``6 N + 12 L d T`` (PaLM, appendix B)."""
    for name, value in (
        ("n_params_non_embedding", n_params_non_embedding),
        ("n_layers", n_layers),
        ("dim", dim),
        ("seq_len", seq_len),
    ):
        if value < 0:
            raise ValueError(f"{name} must not be negative, got {value}")
    return 6.0 * n_params_non_embedding + 12.0 * n_layers * dim * seq_len


def peak_flops(device_name: str | None, dtype: str) -> float | None:
    """Peak dense FLOP/s of one device for ``dtype`` (bf16 | fp16 | fp32); None if unknown.

    ``device_name`` is ``torch.cuda.get_device_name()``, or None/"cpu" for a CPU (no peak:
    MFU is not reported).
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if not device_name or device_name.lower() == "cpu":
        return None
    for pattern, peaks in PEAK_FLOPS:
        if re.search(pattern, device_name, flags=re.IGNORECASE):
            return peaks[dtype]
    return None


def mfu(tokens_per_s: float, flops_per_token: float, peak: float | None) -> float | None:
    """Achieved / peak FLOP/s as a fraction (0.41 = 41%); None when the peak is unknown.

    ``tokens_per_s`` and ``peak`` must describe the same devices: the whole job's tokens/s
    against ``peak * world_size``, or one GPU's share against one GPU's peak.
    """
    if peak is None:
        return None
    if peak <= 0:
        raise ValueError(f"peak FLOP/s must be positive, got {peak}")
    return tokens_per_s * flops_per_token / peak
