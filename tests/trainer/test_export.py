"""``<run_uri>/export``: a Hugging Face Llama folder (names, config, RoPE order, same logits), written at
the end of training or by ``trainer export`` from the newest committed checkpoint."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.trainer.helpers import REPO, run_config
from trainer.builder import build_model
from trainer.cli import main
from trainer.export import load_export, write_export
from trainer.hf import half_to_interleaved
from trainer.model import Transformer
from trainer.presets import ModelArgs
from trainer.storage import open_storage

# Grouped-query attention, so q and k are permuted with different head counts.
ARGS = ModelArgs(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=97, rope_theta=500000.0)


def export(tmp_path, model, args=ARGS, **kwargs):
    uri = (tmp_path / "export").as_uri()
    write_export(
        open_storage(uri),
        uri,
        model.state_dict(),
        args,
        step=3,
        data_uri="file:///d",
        run_uri="file:///r",
        precision="bf16",
        **kwargs,
    )
    return tmp_path / "export", uri


def hf_names(layers: int) -> set[str]:
    per_layer = (
        [f"self_attn.{p}_proj.weight" for p in "qkvo"]
        + [f"mlp.{p}_proj.weight" for p in ("gate", "up", "down")]
        + ["input_layernorm.weight", "post_attention_layernorm.weight"]
    )
    return {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"} | {
        f"model.layers.{i}.{name}" for i in range(layers) for name in per_layer
    }


def test_export_has_hf_names_and_llama_config(tmp_path):
    torch.manual_seed(0)
    folder, _ = export(tmp_path, Transformer(ARGS), seq_len=128)
    assert sorted(p.name for p in folder.iterdir()) == [
        "config.json",
        "export.json",
        "model.safetensors",
        "model_config.json",
    ]
    tensors = load_file(folder / "model.safetensors")
    assert set(tensors) == hf_names(2) and all(t.dtype == torch.float32 for t in tensors.values())
    assert tensors["model.layers.0.self_attn.k_proj.weight"].shape == (32, 64)  # 2 kv heads of 16
    config = json.loads((folder / "config.json").read_text())
    assert config == {
        **config,
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": 97,
        "hidden_size": 64,
        "intermediate_size": ARGS.hidden,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "max_position_embeddings": 128,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
    }
    info = json.loads((folder / "export.json").read_text())
    assert (info["step"], info["layout"], info["param_count"]) == (
        3,
        "hf-llama",
        sum(t.numel() for t in tensors.values()),
    )


def test_load_export_gives_the_same_logits_from_every_layout(tmp_path):
    torch.manual_seed(0)
    model = Transformer(ARGS).eval()
    folder, uri = export(tmp_path, model)
    tokens = torch.randint(0, 97, (2, 10))
    expected = model(tokens)
    loaded, args = load_export(open_storage(uri), uri)
    assert args == ARGS
    torch.testing.assert_close(loaded(tokens), expected, rtol=0, atol=0)
    # A plain Hugging Face folder (no model_config.json) loads through config.json.
    (folder / "model_config.json").unlink()
    torch.testing.assert_close(load_export(open_storage(uri), uri)[0](tokens), expected, rtol=0, atol=0)
    # An export written before the HF layout: our own names, model_config.json, no config.json.
    (folder / "config.json").unlink()
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, folder / "model.safetensors")
    (folder / "model_config.json").write_text(json.dumps(ARGS.to_dict()))
    torch.testing.assert_close(load_export(open_storage(uri), uri)[0](tokens), expected, rtol=0, atol=0)


def test_user_model_exports_its_own_names_and_loads_through_its_builder(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "examples"))
    torch.manual_seed(0)
    built = build_model("tiny", "custom_model:build", 97, 16)
    folder, uri = export(tmp_path, built.model, args=built)
    assert not (folder / "config.json").exists()
    assert json.loads((folder / "model_config.json").read_text()) == built.spec
    assert json.loads((folder / "export.json").read_text())["layout"] == "state-dict"
    loaded, args = load_export(open_storage(uri), uri)
    tokens = torch.randint(0, 97, (2, 16))
    assert args is None
    torch.testing.assert_close(loaded(tokens), built.model.eval()(tokens), rtol=0, atol=0)


def test_missing_export_says_what_to_point_at(tmp_path):
    uri = (tmp_path / "nothing").as_uri()
    with pytest.raises(
        FileNotFoundError, match=f"{uri} holds no model.safetensors; point the model URI at an export"
    ):
        load_export(open_storage(uri), uri)


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_transformers_loads_the_export_as_llama_with_the_same_logits(tmp_path, attention):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = Transformer(ARGS).eval()
    folder, _ = export(tmp_path, model, seq_len=64)
    hf_model = transformers.LlamaForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation=attention
    ).eval()
    tokens = torch.randint(0, 97, (2, 24))
    with torch.no_grad():
        ours, theirs = model(tokens), hf_model(tokens).logits
    torch.testing.assert_close(theirs, ours, rtol=0, atol=1e-4)

    # Without the q/k row permutation HF applies RoPE to the wrong channel pairs.
    tensors = load_file(folder / "model.safetensors")
    for name in list(tensors):
        if name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = ARGS.n_heads if "q_proj" in name else ARGS.kv_heads
            tensors[name] = half_to_interleaved(tensors[name], heads).contiguous()
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    unpermuted = transformers.LlamaForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation=attention
    ).eval()
    with torch.no_grad():
        assert (unpermuted(tokens).logits - ours).abs().max() > 1e-3


@pytest.mark.slow
def test_export_cli_rebuilds_the_same_weights_from_the_checkpoint(reference_run, tmp_path, dataset_uri):
    config, _ = run_config(tmp_path, dataset_uri, "copy")
    shutil.copytree(reference_run["run_dir"] / "checkpoints", tmp_path / "copy" / "checkpoints")
    assert main(["export", "--config", str(config)]) == 0
    exported = tmp_path / "copy" / "export"
    assert (exported / "model.safetensors").read_bytes() == (
        reference_run["run_dir"] / "export" / "model.safetensors"
    ).read_bytes()
    info = json.loads((exported / "export.json").read_text())
    assert (info["step"], info["precision"], info["param_count"]) == (40, "bf16", 139_712)
    assert json.loads((exported / "model_config.json").read_text()) == json.loads(
        (reference_run["run_dir"] / "export" / "model_config.json").read_text()
    )
    hf_config = json.loads((exported / "config.json").read_text())
    assert hf_config.pop("max_position_embeddings") == 32  # the run's train.seq_len
    trained = json.loads((reference_run["run_dir"] / "export" / "config.json").read_text())
    assert hf_config == {k: v for k, v in trained.items() if k != "max_position_embeddings"}


def test_export_without_checkpoints_says_so(tmp_path, dataset_uri):
    config, run_uri = run_config(tmp_path, dataset_uri, "empty")
    with pytest.raises(
        RuntimeError, match=f"no committed checkpoint under {run_uri}/checkpoints; run `trainer train` first"
    ):
        main(["export", "--config", str(config)])
