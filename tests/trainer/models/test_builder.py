"""Models from presets and user builders (``model.builder=module:function``)."""

import os
import tempfile
import textwrap

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from tests.trainer.helpers import REPO
from trainer.config import ConfigError
from trainer.models.builder import build_from_spec, build_model, matmul_params
from trainer.presets import PRESETS, param_count

BAD_BUILDERS = textwrap.dedent("""
    import torch
    from torch import nn

    def model_only(vocab_size, seq_len):
        return nn.Linear(4, vocab_size)

    def foreign_blocks(vocab_size, seq_len):
        model = nn.Sequential(nn.Embedding(vocab_size, 8), nn.Linear(8, vocab_size))
        return model, [nn.Linear(8, 8)]

    def shared_blocks(vocab_size, seq_len):
        a, b = nn.Linear(8, 8), nn.Linear(8, 8)
        b.weight = a.weight
        model = nn.Sequential(nn.Embedding(vocab_size, 8), a, b, nn.Linear(8, vocab_size))
        return model, [a, b]

    def nested_blocks(vocab_size, seq_len):
        inner = nn.Linear(8, 8)
        outer = nn.Sequential(inner)
        model = nn.Sequential(nn.Embedding(vocab_size, 8), outer, nn.Linear(8, vocab_size))
        return model, [outer, inner]

    def wrong_logits(vocab_size, seq_len):
        model = nn.Sequential(nn.Embedding(vocab_size, 8), nn.Linear(8, 3))
        return model, [model[1]]

    def broken_import(vocab_size, seq_len):
        raise AssertionError("never called")

    not_a_function = 3
""")


@pytest.fixture
def user_modules(tmp_path, monkeypatch):
    (tmp_path / "trainops_test_builders.py").write_text(BAD_BUILDERS)
    (tmp_path / "trainops_test_broken.py").write_text("import no_such_package_for_trainops\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.syspath_prepend(str(REPO / "examples"))


def test_preset_blocks_are_its_layers_and_the_description_counts_parameters():
    built = build_model("tiny", None, vocab_size=257, seq_len=32)
    assert built.blocks == list(built.model.layers) and built.block_names == ["layers.0", "layers.1"]
    assert built.param_count == param_count(PRESETS["tiny"].with_vocab(257)) == 139_712
    assert built.describe() == "preset tiny: 139,712 parameters, 2 blocks, dim 64, vocab 257"
    assert built.spec == PRESETS["tiny"].with_vocab(257).to_dict()


def test_unknown_preset_names_it():
    with pytest.raises(
        ValueError, match="unknown model preset 'huge'; pick one of tiny, small, bert-large-size"
    ):
        build_model("huge", None, 257, 32)


@pytest.mark.slow
def test_example_builder_trains_one_step_on_cpu(user_modules):
    torch.manual_seed(0)
    built = build_model("tiny", "custom_model:build", vocab_size=257, seq_len=16)
    assert built.args is None and built.block_names == ["blocks.0", "blocks.1"]
    assert built.describe().startswith(
        f"builder custom_model:build: {built.param_count:,} parameters, 2 blocks"
    )
    tokens = torch.randint(0, 257, (4, 17))
    optimizer = torch.optim.AdamW(built.model.parameters(), lr=1e-2)
    losses = []
    for _ in range(2):
        logits = built.model(tokens[:, :-1])
        assert logits.shape == (4, 16, 257)
        loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()
        assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in built.model.parameters())
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert losses[0] == pytest.approx(torch.log(torch.tensor(257.0)).item(), abs=0.5)
    assert losses[1] < losses[0]
    # 6 N for a user model: every parameter but the two embedding tables.
    embeddings = built.model.tokens.weight.numel() + built.model.positions.weight.numel()
    assert matmul_params(built.model) == built.param_count - embeddings
    assert built.flops_per_token(16) == 6 * (built.param_count - embeddings)


def test_spec_rebuilds_the_same_user_model(user_modules):
    torch.manual_seed(1)
    first = build_model("tiny", "custom_model:build", 257, 16)
    torch.manual_seed(1)
    again = build_from_spec(first.spec)
    assert first.spec == {"builder": "custom_model:build", "vocab_size": 257, "seq_len": 16}
    for (name, a), (_, b) in zip(
        first.model.state_dict().items(), again.model.state_dict().items(), strict=False
    ):
        assert torch.equal(a, b), name


@pytest.mark.parametrize(
    "builder, error, message",
    [
        # the form is judged by the operator's own rule (trainer.config.builder_parts)
        (
            "custom_model.build",
            ConfigError,
            r"model.builder: expected 'module:function', got 'custom_model.build'; name an importable module",
        ),
        ("a:b:c", ConfigError, "got 'a:b:c'"),
        ("team..models:build", ConfigError, "got 'team..models:build'"),  # an empty package name
        ("class:build", ConfigError, "got 'class:build'"),  # a keyword cannot be imported
        (
            "no_such_module_for_trainops:build",
            ImportError,
            "model.builder 'no_such_module_for_trainops:build': cannot import 'no_such_module_for_trainops'",
        ),
        (
            "trainops_test_broken:build",
            ImportError,
            "No module named 'no_such_package_for_trainops'.*PYTHONPATH",
        ),
        ("custom_model:nope", AttributeError, "module 'custom_model' has no function 'nope'"),
        ("trainops_test_builders:not_a_function", AttributeError, "has no function 'not_a_function'"),
        (
            "trainops_test_builders:model_only",
            TypeError,
            r"'trainops_test_builders:model_only' returned a Linear; it must return \(model: nn.Module, blocks",
        ),
        (
            "trainops_test_builders:foreign_blocks",
            ValueError,
            r"block 0 \(Linear\) is not a submodule of the model",
        ),
        ("trainops_test_builders:shared_blocks", ValueError, "blocks '1' and '2' share a parameter"),
        ("trainops_test_builders:nested_blocks", ValueError, "block '1.0' lies inside block '1'"),
        (
            "trainops_test_builders:wrong_logits",
            ValueError,
            r"returned \(2, 4, 3\); it must return logits of shape \(batch, seq, vocab_size\) = \(2, 4, 257\)",
        ),
    ],
)
def test_builder_errors_name_the_bad_value(user_modules, builder, error, message):
    with pytest.raises(error, match=message):
        build_model("tiny", builder, vocab_size=257, seq_len=16)


def test_fsdp2_shards_the_example_blocks_in_a_world_of_one(user_modules):
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    built = build_model("tiny", "custom_model:build", 257, 16)
    store = dist.FileStore(os.path.join(tempfile.mkdtemp(prefix="trainops-"), "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        for block in built.blocks:
            fully_shard(block)
        fully_shard(built.model)
        logits = built.model(torch.randint(0, 257, (2, 16)))
        logits.float().mean().backward()
        assert logits.shape == (2, 16, 257)
        assert all(p.grad is not None for p in built.model.parameters())
    finally:
        dist.destroy_process_group()
