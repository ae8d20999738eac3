"""Model hyper-parameters and size presets: shapes, parameter counts (checked against the built
model) and the ``python -m trainer presets`` table."""

import pytest

from trainer.models.llama import Transformer, count_parameters
from trainer.presets import PRESETS, ModelArgs, non_embedding_params, param_count, preset_table


def test_preset_sizes():
    assert param_count(PRESETS["small"]) == pytest.approx(125e6, rel=0.15)
    assert param_count(PRESETS["bert-large-size"]) == pytest.approx(340e6, rel=0.10)
    assert param_count(PRESETS["1b"]) == pytest.approx(1.1e9, rel=0.05)
    assert param_count(PRESETS["7b"]) == pytest.approx(6.74e9, rel=0.02)


def test_model_args_round_trip_and_reject_unknown_fields():
    args = PRESETS["1b"].with_vocab(257)
    assert ModelArgs.from_dict(args.to_dict()) == args
    with pytest.raises(ValueError, match=r"unknown model hyper-parameters \['depth'\]"):
        ModelArgs.from_dict({**args.to_dict(), "depth": 3})


@pytest.mark.parametrize("preset", ["tiny", "small"])
def test_param_count_formula_matches_the_built_model(preset):
    args = PRESETS[preset].with_vocab(257)
    assert param_count(args) == count_parameters(Transformer(args))


def test_bert_large_size_has_bert_large_shape_and_counts_exactly():
    args = PRESETS["bert-large-size"]
    assert (args.n_layers, args.dim, args.n_heads) == (24, 1024, 16)
    # Building 369M parameters is slow; one block plus the embeddings checks the formula.
    one_block = ModelArgs(**{**args.to_dict(), "n_layers": 1, "vocab_size": 257})
    assert param_count(one_block) == count_parameters(Transformer(one_block))


def test_non_embedding_params_drop_only_the_input_lookup():
    args = PRESETS["tiny"].with_vocab(257)
    model = Transformer(args)
    assert non_embedding_params(args) == count_parameters(model) - model.tok_embeddings.weight.numel()


def test_preset_table_lists_every_preset_with_its_shape_and_size():
    lines = preset_table().splitlines()
    assert lines[0].split() == ["preset", "layers", "dim", "heads", "kv_heads", "ffn_hidden", "params"]
    rows = {line.split()[0]: line.split() for line in lines[1 : len(PRESETS) + 1]}
    assert list(rows) == list(PRESETS)
    assert rows["bert-large-size"][1:4] == ["24", "1024", "16"]
    assert rows["7b"][-1] == "6.74B" and rows["small"][-1] == "134.1M"
    assert "32,000-token vocabulary" in lines[-1]
    assert (
        preset_table(vocab_size=257).splitlines()[1].split()[-1]
        == f"{param_count(PRESETS['tiny'].with_vocab(257)) / 1e6:.1f}M"
    )
