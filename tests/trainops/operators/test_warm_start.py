"""Warm start before launch: ``production``/``auto`` resolved through the pointer, and the source's
shape, vocabulary and tokenizer checked against the run, naming both sides, before anything is
written or launched."""

import re
from types import SimpleNamespace

import pytest
import yaml
from airflow.sdk.exceptions import AirflowFailException, TaskDeferred

from tests.trainer.helpers import TINY_QWEN2
from tests.trainops.cluster.fake_backend import use_fake_cluster
from tests.trainops.operators.helpers import staged_dataset
from trainer.config.hf import llama_config_keys
from trainer.contract import RunLayout, join, model_version_prefix, production_pointer, run_prefix
from trainer.presets import PRESETS
from trainer.storage import open_storage
from trainops.operators import FSDPTrainingOperator
from trainops.operators.warm_start import check_tokenizer, resolve
from trainops.registry.pointer import new_pointer
from trainops.staging.tokenize import TOKENIZER

MODEL = "retrain-lm"


@pytest.fixture
def cluster(monkeypatch):
    return use_fake_cluster(monkeypatch)


@pytest.fixture
def context():
    return {"ti": SimpleNamespace(dag_id="retrain", run_id="manual__1", task_id="train", map_index=-1)}


def llama_folder(
    uri: str,
    *,
    preset: str = "tiny",
    vocab: int = TOKENIZER["vocab_size"],
    config: dict | None = None,
    **info,
) -> str:
    """A source folder's ``config.json`` (the keys ``trainer.export.hf.hf_config`` writes on export, then
    ``config``'s; a None value leaves the key out) and ``export.json`` (``info``); no weights: the
    operator reads only these."""
    args = PRESETS[preset].with_vocab(vocab)
    written = {"model_type": "llama", **llama_config_keys(args), **(config or {})}
    config = {key: value for key, value in written.items() if value is not None}
    storage = open_storage(uri)
    storage.put_json(join(uri, "config.json"), config)
    if info:
        storage.put_json(join(uri, "export.json"), info)
    return uri


def promote(root: str, version: int) -> str:
    uri = model_version_prefix(root, MODEL, version)
    entry = {"at": "2026-01-01T00:00:00+00:00", "action": "promote", "run_uri": None}
    pointer = new_pointer(None, name=MODEL, version=version, version_uri=uri, entry=entry)
    open_storage(root).put_json(production_pointer(root, MODEL), pointer)
    return uri


def operator(root: str, warm: str, **kw):
    data = staged_dataset(f"{root.rsplit('/', 1)[0]}/data/datasets/demo/abc")
    return FSDPTrainingOperator(
        task_id="train",
        dataset={"uri": data},
        storage_root=root,
        trainer_config={"train.max_steps": 10, "init.from": warm},
        **kw,
    )


def written_init(root: str) -> str:
    layout = RunLayout(run_prefix(root, "retrain", "manual__1", "train"))
    return yaml.safe_load(open_storage(root).get(layout.config))["init"]["from"]


# --- the pure decisions -------------------------------------------------------------------
def test_resolve_each_value():
    pointer = {"version": 4, "uri": "s3://b/r/models/m/versions/4"}
    assert resolve("none", model_name="m", pointer=pointer, earlier=None)[0] == "none"
    assert resolve("s3://b/x/", model_name=None, pointer=None, earlier=None)[0] == "s3://b/x/"
    uri, said = resolve("production", model_name="m", pointer=pointer, earlier=None)
    assert uri == pointer["uri"] and "production v4" in said
    assert resolve("auto", model_name="m", pointer=pointer, earlier=None)[0] == pointer["uri"]
    uri, said = resolve("auto", model_name="m", pointer=None, earlier=None)
    assert uri == "none" and "no production version yet" in said
    assert resolve("auto", model_name=None, pointer=None, earlier=None)[0] == "none"
    # a retried task keeps what its first try resolved, though production moved since
    assert resolve("production", model_name="m", pointer=pointer, earlier="file:///v/3")[0] == "file:///v/3"
    with pytest.raises(ValueError, match=r"model 'm' has no production version yet; set init.from=auto"):
        resolve("production", model_name="m", pointer=None, earlier=None)
    with pytest.raises(ValueError, match=r"has no model_name: pass model_name"):
        resolve("production", model_name=None, pointer=pointer, earlier=None)


def test_a_tokenizer_mismatch_names_both_and_an_unknown_one_is_a_warning():
    byte = dict(TOKENIZER)
    assert check_tokenizer(byte, byte, source_uri="s", data_uri="d") is None
    hf_tok = {"kind": "hf", "name": "gpt2", "vocab_size": 50257}
    with pytest.raises(
        ValueError, match=r"trained with tokenizer .*'hf'.* but dataset 'd' is tokenized with .*'byte'"
    ):
        check_tokenizer(hf_tok, byte, source_uri="s", data_uri="d")
    assert "only its shapes and vocabulary were checked" in check_tokenizer(
        None, byte, source_uri="s", data_uri="d"
    )


# --- the operator, before launch ------------------------------------------------------------
def test_production_is_resolved_to_the_version_uri_in_the_written_config(file_root, cluster, context):
    version = llama_folder(promote(file_root, 3), tokenizer=dict(TOKENIZER))
    with pytest.raises(TaskDeferred):
        operator(file_root, "production", model_name=MODEL).execute(context)
    assert written_init(file_root) == version
    promote(file_root, 4)  # production moves; a retry of the same run keeps its parent
    llama_folder(model_version_prefix(file_root, MODEL, 4), tokenizer=dict(TOKENIZER))
    cluster.live = []
    with pytest.raises(TaskDeferred):
        operator(file_root, "production", model_name=MODEL).execute(context)
    assert written_init(file_root) == version


def test_auto_without_production_trains_cold(file_root, cluster, context):
    with pytest.raises(TaskDeferred):
        operator(file_root, "auto", model_name=MODEL).execute(context)
    assert written_init(file_root) == "none"


@pytest.mark.parametrize(
    "folder,message",
    [
        ({"preset": "small"}, r"hidden_size 768 in the source, 64 in the run"),
        ({"vocab": 300}, r"vocab_size 300 in the source, 257 in the run"),
        (
            {"tokenizer": {"kind": "hf", "name": "gpt2", "vocab_size": 257}},
            r"trained with tokenizer .*gpt2.* but dataset .* is tokenized with .*byte",
        ),
    ],
)
def test_a_source_that_does_not_fit_fails_before_anything_is_written_or_launched(
    file_root, tmp_path, cluster, context, folder, message
):
    source = llama_folder((tmp_path / "source").as_uri(), **folder)
    with pytest.raises(ValueError, match=message):
        operator(file_root, source).execute(context)
    assert cluster.launched == []
    assert open_storage(file_root).list(file_root) == []


# A Llama folder of the run's shape whose config.json says it computes another function.
@pytest.mark.parametrize(
    "config,message",
    [
        (  # CodeLlama's
            {"rope_theta": 1e6, "rope_parameters": None},
            r"rope_theta 1000000.0 in the source, 10000.0 in the run",
        ),
        (
            {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}},
            r"rope_scaling \{'factor': 4.0, 'rope_type': 'yarn'\} in the source, none in the run",
        ),
        ({"rms_norm_eps": 1e-6}, r"rms_norm_eps 1e-06 in the source, 1e-05 in the run"),
        ({"tie_word_embeddings": True}, r"tie_word_embeddings True in the source, False in the run"),
        (
            {"hidden_act": "gelu_pytorch_tanh"},
            r"hidden_act 'gelu_pytorch_tanh' in the source, 'silu' in the run",
        ),
        ({"attention_bias": True}, r"attention_bias True in the source, False in the run"),
        ({"mlp_bias": True}, r"mlp_bias True in the source, False in the run"),
        ({"sliding_window": 4096}, r"sliding_window 4096 in the source, none in the run"),
        (
            {"sliding_window": 4096, "use_sliding_window": True},
            r"use_sliding_window True in the source, False in the run",
        ),
    ],
    ids=[
        "rope_theta",
        "rope_scaling",
        "rms_norm_eps",
        "tie_word_embeddings",
        "hidden_act",
        "attention_bias",
        "mlp_bias",
        "sliding_window",
        "use_sliding_window",
    ],
)
def test_a_source_that_computes_another_function_fails_before_anything_is_written_or_launched(
    file_root, tmp_path, cluster, context, config, message
):
    source = llama_folder((tmp_path / "source").as_uri(), config=config, tokenizer=dict(TOKENIZER))
    with pytest.raises(ValueError) as refused:
        operator(file_root, source).execute(context)
    said = str(refused.value)
    assert re.search(message, said), said
    assert said.startswith(f"init.from={source!r} does not fit the run's model")
    assert said.endswith("or set init.from=none")
    assert cluster.launched == []
    assert open_storage(file_root).list(file_root) == []


def test_the_sources_tokenizer_is_its_datasets_when_its_export_names_none(
    file_root, tmp_path, cluster, context
):
    other = staged_dataset((tmp_path / "other").as_uri(), vocab_size=300)
    source = llama_folder((tmp_path / "source").as_uri(), data_uri=other)
    with pytest.raises(ValueError, match=r"'vocab_size': 300.* is tokenized with .*'vocab_size': 257"):
        operator(file_root, source).execute(context)
    assert cluster.launched == []


def test_a_missing_source_or_production_is_refused(file_root, tmp_path, cluster, context):
    with pytest.raises(ValueError, match=r"holds no config.json"):
        operator(file_root, (tmp_path / "nothing").as_uri()).execute(context)
    with pytest.raises(ValueError, match=r"no production version yet"):
        operator(file_root, "production", model_name=MODEL).execute(context)
    assert cluster.launched == []


# --- model.hf: the folder's config.json pinned before launch --------------------------------------
QWEN2 = {"architectures": ["Qwen2ForCausalLM"], **TINY_QWEN2, "vocab_size": 300, "rms_norm_eps": 1e-6}


def hf_folder(uri: str, config: dict | None = QWEN2, weights: bool = True) -> str:
    """A Hugging Face folder as the operator reads it: config.json and the weights' presence."""
    storage = open_storage(uri)
    if config is not None:
        storage.put_json(join(uri, "config.json"), config)
    if weights:
        storage.put(join(uri, "model.safetensors"), b"not read before launch")
    return uri


def hf_operator(root: str, folder: str, **config):
    data = staged_dataset(f"{root.rsplit('/', 1)[0]}/data/datasets/demo/abc")
    return FSDPTrainingOperator(
        task_id="train",
        dataset={"uri": data},
        storage_root=root,
        trainer_config={"train.max_steps": 10, "train.seq_len": 32, "model.hf": folder, **config},
    )


def test_model_hf_is_pinned_in_the_written_config_and_sizes_the_run(file_root, tmp_path, cluster, context):
    folder = hf_folder((tmp_path / "team-model").as_uri())
    with pytest.raises(TaskDeferred):
        hf_operator(file_root, folder).execute(context)
    layout = RunLayout(run_prefix(file_root, "retrain", "manual__1", "train"))
    written = yaml.safe_load(open_storage(file_root).get(layout.config))["model"]
    assert (written["hf"], written["hf_config"]) == (folder, QWEN2)  # what every attempt builds
    assert len(cluster.launched) == 1


@pytest.mark.parametrize(
    "config, weights, extra, message",
    [
        (
            None,
            True,
            {},
            r"model.hf='.*' holds no config.json; point model.hf at a Hugging Face model folder",
        ),
        (QWEN2, False, {}, r"holds neither model.safetensors nor model.safetensors.index.json"),
        (
            {**QWEN2, "model_type": "t5"},
            True,
            {},
            r"model.hf='.*': config.json: model_type 't5' is not supported; trainops trains llama, mistral, qwen2",
        ),
        (
            {**QWEN2, "vocab_size": 200},
            True,
            {},
            r"model.hf_config.vocab_size=200 is smaller than the vocabulary of the dataset's tokenizer \(257",
        ),
    ],
    ids=["no-config", "no-weights", "family", "vocabulary"],
)
def test_a_model_hf_folder_that_cannot_train_fails_before_anything_is_written_or_launched(
    file_root, tmp_path, cluster, context, config, weights, extra, message
):
    folder = hf_folder((tmp_path / "team-model").as_uri(), config, weights)
    # a folder that is not there yet may be retried; a config that cannot train fails at once
    with pytest.raises((ValueError, AirflowFailException), match=message):
        hf_operator(file_root, folder, **extra).execute(context)
    assert cluster.launched == []
    assert open_storage(file_root).list(file_root) == []


def test_a_model_hf_run_warm_starts_from_a_version_of_its_own_model_only(
    file_root, tmp_path, cluster, context
):
    """init.from with model.hf (a production version of the team's model, as auto resolves it):
    the folder says what the model is, the version gives the weights; a version of another model
    is refused before launch, naming both sides."""
    folder = hf_folder((tmp_path / "team-model").as_uri())
    version = hf_folder((tmp_path / "v1").as_uri(), {**QWEN2, "torch_dtype": "bfloat16", "eos_token_id": 3})
    with pytest.raises(TaskDeferred):
        hf_operator(file_root, folder, **{"init.from": version}).execute(context)
    assert len(cluster.launched) == 1
    for other, message in (
        (
            {**QWEN2, "hidden_size": 128},
            r"does not fit the run's model: hidden_size 128 in the source, 64 in the run",
        ),
        ({**QWEN2, "model_type": "llama"}, r"holds a 'llama' model, the run trains a 'qwen2' one"),
    ):
        wrong = hf_folder((tmp_path / f"wrong-{other['hidden_size']}-{other['model_type']}").as_uri(), other)
        with pytest.raises((ValueError, AirflowFailException), match=message):
            hf_operator(file_root, folder, **{"init.from": wrong}).execute(context)
    assert len(cluster.launched) == 1


def test_the_model_hf_folders_tokenizer_must_be_the_datasets():
    from trainops.operators.warm_start import hf_tokenizer_problem

    hf_tok = {
        "kind": "huggingface",
        "vocab_size": 300,
        "eos_id": 2,
        "uri": "s3://m/q/tokenizer.json",
        "sha256": "ab" * 32,
    }
    common = {"data_uri": "s3://d/v1"}
    assert hf_tokenizer_problem(
        "s3://m/q/", export_tokenizer=None, tokenizer_sha256="ab" * 32, dataset=hf_tok, **common
    ) == (None, None)
    error, _ = hf_tokenizer_problem(
        "s3://m/q/", export_tokenizer=None, tokenizer_sha256="cd" * 32, dataset=hf_tok, **common
    )
    assert error is not None and "has its own tokenizer (tokenizer.json, sha256 cdcdcdcdcdcd)" in error
    assert "StageDatasetOperator tokenizer='s3://m/q/tokenizer.json'" in error
    error, _ = hf_tokenizer_problem(
        "s3://m/q/", export_tokenizer=None, tokenizer_sha256="ab" * 32, dataset=dict(TOKENIZER), **common
    )
    assert error is not None and "is tokenized with another (byte)" in error
    # a trainops export names the spec it was trained with
    assert hf_tokenizer_problem(
        "s3://m/v3/",
        export_tokenizer=dict(TOKENIZER),
        tokenizer_sha256="ef" * 32,
        dataset=dict(TOKENIZER),
        **common,
    ) == (None, None)
    error, _ = hf_tokenizer_problem(
        "s3://m/v3/", export_tokenizer=hf_tok, tokenizer_sha256=None, dataset=dict(TOKENIZER), **common
    )
    assert error is not None and "was trained with tokenizer" in error
    _, warning = hf_tokenizer_problem(
        "s3://m/q/", export_tokenizer=None, tokenizer_sha256=None, dataset=dict(TOKENIZER), **common
    )
    assert warning is not None and "holds no tokenizer.json" in warning


def test_a_model_hf_folder_with_another_tokenizer_fails_before_anything_is_written_or_launched(
    file_root, tmp_path, cluster, context
):
    folder = hf_folder((tmp_path / "team-model").as_uri())
    open_storage(folder).put(join(folder, "tokenizer.json"), b'{"model": {"type": "BPE"}}')
    with pytest.raises(
        ValueError, match=r"has its own tokenizer \(tokenizer.json, sha256 [0-9a-f]{12}\), but dataset"
    ):
        hf_operator(file_root, folder).execute(context)
    assert cluster.launched == []
    assert open_storage(file_root).list(file_root) == []
