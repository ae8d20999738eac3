"""``<run_uri>/export``: a Hugging Face Llama folder (names, config, RoPE order, same logits), written at
the end of training or by ``trainer export`` from the newest committed checkpoint."""

import gc
import json
import os
import re
import shutil
import tempfile
import weakref

import pytest
import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file

from tests.trainer.helpers import REPO, run_config
from trainer.cli import main
from trainer.data import DataError
from trainer.export import folder as export_module
from trainer.export.folder import load_checkpoint_model, load_export, write_export
from trainer.export.hf import from_hf_state_dict, half_to_interleaved
from trainer.export.safetensors_writer import StreamWriter
from trainer.models.builder import build_model
from trainer.models.llama import Transformer
from trainer.presets import ModelArgs
from trainer.storage import open_storage

# Grouped-query attention, so q and k are permuted with different head counts.
ARGS = ModelArgs(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=97, rope_theta=500000.0)
BYTE_TOKENIZER = {"kind": "byte", "vocab_size": 257, "eos_id": 256}  # the manifest's spec


def export(tmp_path, model, args=ARGS, name="export", state_dict=None, **kwargs):
    """Export ``model``; the tokenizer is given as the manifest holds it (``file:///d`` has none)."""
    kwargs.setdefault("tokenizer", BYTE_TOKENIZER)
    uri = (tmp_path / name).as_uri()
    write_export(
        open_storage(uri),
        uri,
        model.state_dict() if state_dict is None else state_dict,
        args,
        step=3,
        data_uri="file:///d",
        run_uri="file:///r",
        precision="bf16",
        **kwargs,
    )
    return tmp_path / name, uri


def rounded(model):
    """``model`` with every weight rounded to bf16 (what a bf16 export holds), still fp32."""
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16))
    return model


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
        "generation_config.json",
        "model.safetensors",
        "model_config.json",
        "special_tokens_map.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    tensors = load_file(folder / "model.safetensors")
    assert set(tensors) == hf_names(2) and all(t.dtype == torch.bfloat16 for t in tensors.values())
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
        "torch_dtype": "bfloat16",
        "bos_token_id": 256,  # the byte tokenizer's EOS, which also starts every record but the first
        "eos_token_id": 256,
    }
    assert "pad_token_id" not in config  # the byte tokenizer has none
    assert json.loads((folder / "generation_config.json").read_text()) == {
        "bos_token_id": 256,
        "eos_token_id": 256,
        "max_length": 128,
        "do_sample": False,
    }
    info = json.loads((folder / "export.json").read_text())
    assert (info["step"], info["layout"], info["dtype"], info["param_count"]) == (
        3,
        "hf-llama",
        "bf16",
        sum(t.numel() for t in tensors.values()),
    )
    # what a warm start from this export checks the next dataset's tokenizer against
    assert info["tokenizer"] == {"kind": "byte", "vocab_size": 257, "eos_id": 256}


def test_fp32_on_request_is_the_trained_weights_bit_for_bit_and_bf16_their_rounding_in_half_the_bytes(
    tmp_path,
):
    torch.manual_seed(0)
    model = Transformer(ARGS)
    fp32_folder, _ = export(tmp_path, model, name="fp32", dtype="fp32")
    bf16_folder, _ = export(tmp_path, model, name="bf16")
    fp32, bf16 = load_file(fp32_folder / "model.safetensors"), load_file(bf16_folder / "model.safetensors")
    back = from_hf_state_dict(fp32, ARGS)
    assert all(t.dtype == torch.float32 for t in fp32.values())
    assert back.keys() == model.state_dict().keys()
    assert all(torch.equal(back[k], v) for k, v in model.state_dict().items())
    assert all(
        t.dtype == torch.bfloat16 and torch.equal(t, fp32[k].to(torch.bfloat16)) for k, t in bf16.items()
    )
    assert 2 * sum(t.nbytes for t in bf16.values()) == sum(t.nbytes for t in fp32.values())
    assert json.loads((fp32_folder / "config.json").read_text())["torch_dtype"] == "float32"
    ratio = os.path.getsize(bf16_folder / "model.safetensors") / os.path.getsize(
        fp32_folder / "model.safetensors"
    )
    assert 0.5 <= ratio < 0.52, ratio  # the header is the same size but for the dtype names
    with pytest.raises(
        ValueError, match=re.escape("export dtype 'fp16' is not one of bf16, fp32; set export.dtype")
    ):
        export(tmp_path, model, name="fp16", dtype="fp16")


def test_load_export_gives_the_same_logits_from_every_layout(tmp_path):
    torch.manual_seed(0)
    model = Transformer(ARGS).eval()
    folder, uri = export(tmp_path, model, dtype="fp32")
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


def test_a_bf16_export_loads_into_an_fp32_model_holding_exactly_the_rounded_weights(tmp_path):
    torch.manual_seed(0)
    model = Transformer(ARGS).eval()
    _, uri = export(tmp_path, model)
    loaded, _ = load_export(open_storage(uri), uri)
    assert all(p.dtype == torch.float32 for p in loaded.parameters())
    tokens = torch.randint(0, 97, (2, 10))
    with torch.no_grad():
        torch.testing.assert_close(loaded(tokens), rounded(model)(tokens), rtol=0, atol=0)


def test_user_model_exports_its_own_names_and_loads_through_its_builder(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "examples"))
    torch.manual_seed(0)
    built = build_model("tiny", "custom_model:build", 97, 16)
    folder, uri = export(tmp_path, built.model, args=built, dtype="fp32")
    assert not (folder / "config.json").exists()
    assert json.loads((folder / "model_config.json").read_text()) == built.spec
    assert json.loads((folder / "export.json").read_text())["layout"] == "state-dict"
    loaded, args = load_export(open_storage(uri), uri)
    tokens = torch.randint(0, 97, (2, 16))
    assert args is None
    torch.testing.assert_close(loaded(tokens), built.model.eval()(tokens), rtol=0, atol=0)


def test_an_hf_config_model_exports_its_own_class_and_names_a_tied_head_once(tmp_path):
    """Exported under the HF model's own names (no trainer wrapper), the tied LM head stored once
    as transformers saves it; loaded back (``load_export``), tied again and bit for bit."""
    values = {
        "model_type": "qwen2",
        "vocab_size": 97,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "tie_word_embeddings": True,
    }
    torch.manual_seed(0)
    built = build_model("tiny", None, 0, 16, hf_config=values)
    folder, uri = export(tmp_path, built.model, args=built, dtype="fp32")
    names = set(load_file(folder / "model.safetensors"))
    assert "model.embed_tokens.weight" in names and "lm_head.weight" not in names
    assert not any(name.startswith("hf.") for name in names)
    config = json.loads((folder / "config.json").read_text())
    assert (config["architectures"], config["model_type"], config["dtype"]) == (
        ["Qwen2ForCausalLM"],
        "qwen2",
        "float32",
    )
    assert json.loads((folder / "export.json").read_text())["layout"] == "hf"
    loaded, args = load_export(open_storage(uri), uri)
    assert args is None and loaded.hf.lm_head.weight is loaded.hf.model.embed_tokens.weight
    tokens = torch.randint(0, 97, (2, 16))
    with torch.no_grad():
        torch.testing.assert_close(loaded(tokens), built.model.eval()(tokens), rtol=0, atol=0)


def test_missing_export_says_what_to_point_at(tmp_path):
    uri = (tmp_path / "nothing").as_uri()
    with pytest.raises(
        FileNotFoundError,
        match=re.escape(f"{uri} holds no model.safetensors (nor model.safetensors.index.json); point the"),
    ):
        load_export(open_storage(uri), uri)


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_transformers_loads_the_export_as_llama_with_the_same_logits(tmp_path, attention):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = Transformer(ARGS).eval()
    folder, _ = export(tmp_path, model, seq_len=64, dtype="fp32")
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


def test_transformers_loads_the_bf16_export_in_bf16_or_upcast_to_the_same_logits(tmp_path):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = Transformer(ARGS).eval()
    folder, _ = export(tmp_path, model, seq_len=64)
    native = transformers.LlamaForCausalLM.from_pretrained(folder, dtype="auto")
    assert {p.dtype for p in native.parameters()} == {torch.bfloat16}  # config.json says bfloat16
    upcast = transformers.LlamaForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    tokens = torch.randint(0, 97, (2, 24))
    with torch.no_grad():
        torch.testing.assert_close(upcast(tokens).logits, rounded(model)(tokens), rtol=0, atol=1e-4)


def test_above_the_size_limit_the_weights_are_hf_shards_with_an_index_that_every_reader_reads(tmp_path):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = rounded(Transformer(ARGS).eval())
    one, _ = export(tmp_path, model, name="one", seq_len=64)
    limit = 40_000  # bytes: the bf16 model is about 180 kB, its largest tensors 12 kB
    folder, uri = export(tmp_path, model, name="many", seq_len=64, max_shard_bytes=limit)
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    count = len(files)
    assert count > 2 and files == [f"model-{i:05d}-of-{count:05d}.safetensors" for i in range(1, count + 1)]
    assert not (folder / "model.safetensors").exists()
    single = load_file(one / "model.safetensors")
    parts = {name: load_file(folder / name) for name in files}
    assert all(sum(t.nbytes for t in part.values()) <= limit for part in parts.values())
    assert {k: name for name, part in parts.items() for k in part} == index["weight_map"]
    merged = {k: v for part in parts.values() for k, v in part.items()}
    assert merged.keys() == single.keys() and all(torch.equal(merged[k], v) for k, v in single.items())
    assert index["metadata"]["total_size"] == sum(t.nbytes for t in single.values())
    assert json.loads((folder / "export.json").read_text())["weight_files"] == files
    tokens = torch.randint(0, 97, (2, 12))
    with torch.no_grad():
        expected = model(tokens)
        torch.testing.assert_close(load_export(open_storage(uri), uri)[0](tokens), expected, rtol=0, atol=0)
        hf_model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        torch.testing.assert_close(hf_model(tokens).logits, expected, rtol=0, atol=1e-4)
    # Re-exported under the limit into the same folder: one file, and no shard of the last one left.
    export(tmp_path, model, name="many", seq_len=64)
    assert sorted(p.name for p in folder.glob("model*.safetensors*")) == ["model.safetensors"]
    export(tmp_path, model, name="many", seq_len=64, max_shard_bytes=limit)
    assert sorted(p.name for p in folder.glob("model*.safetensors*")) == [
        *files,
        "model.safetensors.index.json",
    ]


def test_the_tokenizer_comes_from_the_manifest_at_data_uri(tmp_path, dataset_uri):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    uri = (tmp_path / "export").as_uri()
    write_export(
        open_storage(uri),
        uri,
        Transformer(ARGS).state_dict(),
        ARGS,
        step=1,
        data_uri=dataset_uri,
        run_uri="file:///r",
        precision="bf16",
        seq_len=32,
    )
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "export")
    assert tokenizer.encode("[news] a dog eats.") == list(b"[news] a dog eats.")
    assert (tokenizer.eos_token_id, tokenizer.model_max_length) == (256, 32)
    # Weights made outside a run (no dataset): no tokenizer to ship, and config.json says no ids.
    bare = (tmp_path / "bare").as_uri()
    write_export(open_storage(bare), bare, {}, ARGS, step=0, data_uri="", run_uri="", precision="fp32")
    assert sorted(p.name for p in (tmp_path / "bare").iterdir()) == [
        "config.json",
        "export.json",
        "model.safetensors",
        "model_config.json",
    ]
    assert "eos_token_id" not in json.loads((tmp_path / "bare" / "config.json").read_text())
    missing = (tmp_path / "no-dataset").as_uri()
    with pytest.raises(DataError, match=f"data_uri '{missing}' holds no manifest.json"):
        write_export(
            open_storage(uri), uri, {}, ARGS, step=1, data_uri=missing, run_uri="file:///r", precision="bf16"
        )


def _world_of_one():
    store = dist.FileStore(os.path.join(tempfile.mkdtemp(prefix="trainops-"), "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)


@pytest.fixture
def young_heap():
    """The suite's objects so far set aside from the collector (``gc.freeze``): a test that
    collects at every step then scans what it made, not the thousands of modules and objects the
    suite has loaded (this test took 73 s in the whole suite, 10 s alone)."""
    gc.collect()
    gc.freeze()
    yield
    gc.unfreeze()


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_the_export_of_a_sharded_model_holds_one_tensor_at_a_time_and_writes_the_same_bytes(
    tmp_path, monkeypatch, dtype, young_heap
):
    """Every CPU tensor the export makes (each gather's result, each tensor handed to the
    writer) is tracked by a weak reference; at each of those points, the bytes still alive
    must be about one tensor, not the model."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    torch.manual_seed(0)
    model = Transformer(ARGS)
    plain_folder, _ = export(tmp_path, model, name="plain", dtype=dtype)
    own = set[int]()
    held: list[weakref.ref] = []
    peak = 0

    def observe(tensor=None):
        nonlocal peak
        if tensor is not None:
            held.append(weakref.ref(tensor))
        gc.collect()
        alive = {}
        for ref in held:
            t = ref()
            if t is not None and t.untyped_storage().data_ptr() not in own:  # not the model's own
                alive[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        peak = max(peak, sum(alive.values()))

    gathered, write = export_module._gathered, StreamWriter.write

    def tracked_gathered(value, dtype, keep):
        assert isinstance(value, DTensor)  # the sharded path, gathered tensor by tensor
        observe()  # what the previous tensors left
        out = gathered(value, dtype, keep)
        observe(out)
        return out

    def tracked_write(self, name, tensor):
        observe(tensor)
        return write(self, name, tensor)

    monkeypatch.setattr(export_module, "_gathered", tracked_gathered)
    monkeypatch.setattr(StreamWriter, "write", tracked_write)
    _world_of_one()
    try:
        for block in model.layers:
            fully_shard(block)
        fully_shard(model)
        state = model.state_dict()
        own.update(v.to_local().untyped_storage().data_ptr() for v in state.values())
        sharded_folder, _ = export(tmp_path, model, name="sharded", state_dict=state, dtype=dtype)
    finally:
        dist.destroy_process_group()
    itemsize = 2 if dtype == "bf16" else 4
    largest = max(t.numel() for t in state.values()) * itemsize
    model_bytes = sum(t.numel() for t in state.values()) * itemsize
    # A q/k weight and its HF-order copy may be held together: at most two tensors. (In a world
    # of one, an fp32 gather may hand back the shard itself, which is no extra memory.)
    assert 0 < peak <= 2 * largest < model_bytes / 4, (peak, largest, model_bytes)
    assert (sharded_folder / "model.safetensors").read_bytes() == (
        plain_folder / "model.safetensors"
    ).read_bytes()
    print(f"export peak held {peak} B, largest tensor {largest} B, model {model_bytes} B ({dtype})")


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


@pytest.mark.slow
def test_an_fp32_export_of_a_run_is_its_checkpoint_bit_for_bit_and_the_bf16_one_its_rounding(
    reference_run, tmp_path, dataset_uri
):
    config, run_uri = run_config(tmp_path, dataset_uri, "copy")
    shutil.copytree(reference_run["run_dir"] / "checkpoints", tmp_path / "copy" / "checkpoints")
    assert main(["export", "--config", str(config), "export.dtype=fp32"]) == 0
    fp32 = load_file(tmp_path / "copy" / "export" / "model.safetensors")
    built, step, _ = load_checkpoint_model(open_storage(run_uri), f"{run_uri}/checkpoints")
    assert step == 40 and built.args is not None
    trained = built.model.state_dict()
    back = from_hf_state_dict(fp32, built.args)
    assert back.keys() == trained.keys() and all(torch.equal(back[k], v) for k, v in trained.items())
    # the export written at the end of training (gathered from the shards, bf16)
    bf16 = load_file(reference_run["run_dir"] / "export" / "model.safetensors")
    assert bf16.keys() == fp32.keys()
    assert all(
        t.dtype == torch.bfloat16 and torch.equal(t, fp32[k].to(torch.bfloat16)) for k, t in bf16.items()
    )
    assert json.loads((tmp_path / "copy" / "export" / "export.json").read_text())["dtype"] == "fp32"


def test_export_without_checkpoints_says_so(tmp_path, dataset_uri):
    config, run_uri = run_config(tmp_path, dataset_uri, "empty")
    with pytest.raises(
        RuntimeError, match=f"no committed checkpoint under {run_uri}/checkpoints; run `trainer train` first"
    ):
        main(["export", "--config", str(config)])
