import pytest
import torch

from trainer.model import Transformer, count_parameters
from trainer.presets import PRESETS, ModelArgs, param_count


@pytest.mark.parametrize("preset", ["tiny", "small"])
def test_param_count_formula_matches_the_built_model(preset):
    args = PRESETS[preset].with_vocab(257)
    assert param_count(args) == count_parameters(Transformer(args))


def test_grouped_query_attention_counts_and_runs():
    args = ModelArgs(dim=64, n_layers=1, n_heads=8, n_kv_heads=2, vocab_size=50)
    model = Transformer(args)
    assert param_count(args) == count_parameters(model)
    assert model(torch.randint(0, 50, (2, 5))).shape == (2, 5, 50)


def test_preset_sizes():
    assert param_count(PRESETS["small"]) == pytest.approx(125e6, rel=0.15)
    assert param_count(PRESETS["1b"]) == pytest.approx(1.1e9, rel=0.05)
    assert param_count(PRESETS["7b"]) == pytest.approx(6.74e9, rel=0.02)


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


def test_model_args_round_trip_and_reject_unknown_fields():
    args = PRESETS["1b"].with_vocab(257)
    assert ModelArgs.from_dict(args.to_dict()) == args
    with pytest.raises(ValueError, match=r"unknown model hyper-parameters \['depth'\]"):
        ModelArgs.from_dict({**args.to_dict(), "depth": 3})
