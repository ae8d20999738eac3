"""The Llama-style decoder: shapes, causality, untied embeddings, grouped-query attention."""

import torch

from trainer.model import Transformer, count_parameters
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
