"""The Llama-style decoder: shapes, causality, untied embeddings, grouped-query attention, and
RMSNorm's fp32 statistics without fp32 copies kept for backward."""

import torch

from trainer.models.llama import RMSNorm, Transformer, _RMSNormFunction, count_parameters
from trainer.presets import PRESETS, ModelArgs, param_count


def test_grouped_query_attention_counts_and_runs():
    args = ModelArgs(dim=64, n_layers=1, n_heads=8, n_kv_heads=2, vocab_size=50)
    model = Transformer(args)
    assert param_count(args) == count_parameters(model)
    assert model(torch.randint(0, 50, (2, 5))).shape == (2, 5, 50)


def test_forward_shapes_and_causality():
    torch.manual_seed(0)
    model = Transformer(PRESETS["tiny"].with_vocab(257)).eval()
    tokens = torch.randint(0, 257, (3, 12))
    logits = model(tokens)
    assert logits.shape == (3, 12, 257) and logits.dtype == torch.float32
    changed = tokens.clone()
    changed[:, 8:] = (changed[:, 8:] + 1) % 257
    # A later token must not change earlier predictions.
    torch.testing.assert_close(model(changed)[:, :8], logits[:, :8])
    assert not torch.allclose(model(changed)[:, 8:], logits[:, 8:])


def test_untied_embeddings_and_shardable_layers():
    model = Transformer(PRESETS["tiny"].with_vocab(257))
    assert model.output.weight.data_ptr() != model.tok_embeddings.weight.data_ptr()
    assert isinstance(model.layers, torch.nn.ModuleList) and len(model.layers) == 2


def plain_rms_norm(x, weight, eps):
    """RMSNorm as autograd would write it (trainer.models.llama before #14): the reference."""
    out = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
    return out.type_as(x) * weight


def test_rms_norm_gradients_are_exact_in_float64():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 8, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, w: _RMSNormFunction.apply(x, w, 1e-5), (x, weight))


def test_rms_norm_in_bf16_gives_the_plain_output_and_gradients_at_least_as_close():
    torch.manual_seed(0)
    norm = RMSNorm(256, 1e-5)
    norm.weight.data.normal_(1.0, 0.1)
    x64 = torch.randn(4, 16, 256, dtype=torch.float64, requires_grad=True)
    g64 = torch.randn(4, 16, 256, dtype=torch.float64)
    w64 = norm.weight.detach().double().requires_grad_()
    (plain_rms_norm(x64, w64, 1e-5) * g64).sum().backward()
    errors = {}
    for name, f in (
        ("ours", lambda x, w: norm.bfloat16()(x)),
        ("plain", lambda x, w: plain_rms_norm(x, w, 1e-5)),
    ):
        x = x64.detach().bfloat16().requires_grad_()
        norm.weight.grad = None
        out = f(x, norm.bfloat16().weight)
        (out * g64.bfloat16()).sum().backward()
        errors[name] = float((x.grad.double() - x64.grad).norm() / x64.grad.norm())
        errors[name + "_weight"] = float((norm.weight.grad.double() - w64.grad).norm() / w64.grad.norm())
        if name == "ours":
            ours_out = out.detach()
        else:  # the forward rounds exactly as before: outputs are bit for bit the same
            assert torch.equal(ours_out, out.detach())
    assert errors["ours"] <= errors["plain"] and errors["ours_weight"] <= errors["plain_weight"], errors


def saved_bytes(fn, *inputs):
    """Bytes autograd keeps for backward while ``fn(*inputs)`` runs (each storage once)."""
    seen = {}

    def pack(t):
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(*inputs)
    return sum(seen.values())


def test_rms_norm_in_bf16_keeps_only_its_input_and_one_fp32_scale_per_row():
    norm = RMSNorm(512, 1e-5).bfloat16()
    x = torch.randn(2, 64, 512, dtype=torch.bfloat16, requires_grad=True)
    rows = 2 * 64
    kept = saved_bytes(norm, x)
    assert kept == x.numel() * 2 + rows * 4 + 512 * 2  # x, 1/rms per row, the weight
    # Autograd's own version keeps two fp32 copies of x and the bf16 product: six times x's bytes.
    assert saved_bytes(lambda x: plain_rms_norm(x, norm.weight, 1e-5), x) >= 5 * x.numel() * 2
