"""``trainer evaluate`` on the shared trained run (single process, in-process CLI): windows, slices,
exports and checkpoints as model URIs."""

import dataclasses
import json
import math
import shutil

import numpy as np
import pytest
import torch

from tests.trainer.helpers import run_config
from trainer.cli import main
from trainer.config import ConfigError
from trainer.data import TokenStream
from trainer.evaluate import eval_device, token_losses
from trainer.export.folder import write_export
from trainer.models.llama import Transformer
from trainer.presets import PRESETS
from trainer.storage import open_storage

ARGS = PRESETS["tiny"].with_vocab(257)
SEQ = 16


@pytest.fixture
def stream(tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "eval.bin"
    rng.integers(0, ARGS.vocab_size, 40 * SEQ + 7, dtype=np.uint16).tofile(path)  # 40 windows and a short one
    return TokenStream([path], "uint16")


@pytest.fixture
def model():
    torch.manual_seed(0)
    return Transformer(ARGS).eval()


@pytest.mark.slow
def test_batched_windows_give_the_unbatched_losses_in_batches_of_the_setting(model, stream):
    shapes: list[tuple[int, ...]] = []
    model.register_forward_hook(lambda module, inputs, output: shapes.append(tuple(inputs[0].shape)))
    batched = token_losses(model, stream, SEQ, batch_size=8)
    assert shapes == [(8, SEQ)] * 5 + [(1, 6)]  # 40 full windows in 5 batches, then the short one
    shapes.clear()
    one_by_one = token_losses(model, stream, SEQ, batch_size=1)
    assert shapes == [(1, SEQ)] * 40 + [(1, 6)]
    assert np.isnan(batched[0]) and not np.isnan(batched[1:]).any()
    np.testing.assert_allclose(batched, one_by_one, rtol=1e-5, atol=0)
    assert token_losses(model, stream, SEQ, batch_size=8, max_batches=2)[1 : 2 * 8 * SEQ + 1].tolist() == (
        batched[1 : 2 * 8 * SEQ + 1].tolist()
    )


def test_a_gpu_evaluates_in_bf16_autocast_and_the_cpu_in_fp32_as_before(model, stream):
    cuda, cpu = eval_device(True, {}), eval_device(False, {})
    # a job launched with gpus_per_node=0 stays on the CPU even where a GPU is visible
    assert eval_device(True, {"TRAINOPS_GPUS_PER_NODE": "0"}).device.type == "cpu"
    assert eval_device(True, {"TRAINOPS_GPUS_PER_NODE": "1"}).device.type == "cuda"
    assert (cuda.device.type, cuda.autocast, cuda.describe()) == (
        "cuda",
        torch.bfloat16,
        "cuda, bf16 autocast",
    )
    assert (cpu.device.type, cpu.autocast, cpu.describe()) == ("cpu", None, "cpu, fp32")
    fp32 = token_losses(model, stream, SEQ, 8)
    assert np.array_equal(fp32, token_losses(model, stream, SEQ, 8, device=cpu), equal_nan=True)
    # The autocast path, on the CPU (the same code CUDA runs): close, and not the fp32 figures.
    bf16 = token_losses(model, stream, SEQ, 8, device=dataclasses.replace(cpu, autocast=torch.bfloat16))
    assert not np.array_equal(bf16, fp32, equal_nan=True)
    assert abs(np.nanmean(bf16) - np.nanmean(fp32)) < 0.01 * np.nanmean(fp32)


@pytest.mark.gpu
def test_cuda_evaluation_matches_the_cpu_to_bf16_tolerance(model, stream):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    cpu = token_losses(model, stream, SEQ, 8)
    cuda = token_losses(model.to("cuda"), stream, SEQ, 8, device=eval_device(True, {}))
    assert np.isnan(cuda[0]) and not np.isnan(cuda[1:]).any()
    assert abs(np.nanmean(cuda) - np.nanmean(cpu)) < 0.01 * np.nanmean(cpu)


@pytest.mark.slow
def test_trained_model_beats_untrained_baseline(reference_run, tmp_path):
    untrained_uri = (tmp_path / "untrained").as_uri()
    torch.manual_seed(0)
    args = PRESETS["tiny"].with_vocab(257)
    write_export(
        open_storage(untrained_uri),
        untrained_uri,
        Transformer(args).state_dict(),
        args,
        step=0,
        data_uri="",
        run_uri="",
        precision="fp32",
    )
    output = tmp_path / "eval.json"
    assert (
        main(
            [
                "evaluate",
                "--config",
                str(reference_run["config"]),
                f"eval.baseline_uri={untrained_uri}",
                f"eval.output_uri={output.as_uri()}",
            ]
        )
        == 0
    )

    report = json.loads(output.read_text())
    manifest = json.loads(open_storage(report["data_uri"]).get(report["data_uri"] + "/manifest.json"))
    eval_tokens = manifest["splits"]["eval"]["tokens"]
    candidate, baseline = report["candidate"], report["baseline"]
    assert (report["format"], report["split"]) == ("trainops.eval/v1", "eval")
    assert (
        candidate["model_uri"] == reference_run["run_uri"] + "/export"
        and baseline["model_uri"] == untrained_uri
    )
    assert math.isfinite(candidate["eval_loss"]) and candidate["eval_loss"] < baseline["eval_loss"] - 1.0
    assert baseline["eval_loss"] == pytest.approx(math.log(257), abs=0.2)  # near-uniform guesses
    assert candidate["perplexity"] == pytest.approx(math.exp(candidate["eval_loss"]))
    assert candidate["tokens"] == baseline["tokens"] == eval_tokens - 1
    by_source = candidate["slices"]["source"]
    assert set(by_source) == {"news", "wiki", "forum"}
    assert sum(s["tokens"] for s in by_source.values()) == candidate["tokens"]
    weighted = sum(s["eval_loss"] * s["tokens"] for s in by_source.values()) / candidate["tokens"]
    assert weighted == pytest.approx(candidate["eval_loss"])
    assert set(baseline["slices"]["source"]) == set(by_source)


@pytest.mark.slow
def test_evaluate_defaults_to_the_run_export_and_eval_folder(reference_run):
    assert (
        main(
            ["evaluate", "--config", str(reference_run["config"]), "eval.max_batches=2", "eval.batch_size=4"]
        )
        == 0
    )
    report = json.loads((reference_run["run_dir"] / "eval" / "metrics.json").read_text())
    assert report["baseline"] is None
    assert report["candidate"]["tokens"] == 2 * 4 * 32  # two full batches of 4 windows of seq_len 32


def _evaluate(config, tmp_path, name, *overrides) -> dict:
    output = tmp_path / f"{name}.json"
    assert (
        main(
            [
                "evaluate",
                "--config",
                str(config),
                f"eval.output_uri={output.as_uri()}",
                "eval.max_batches=4",
                *overrides,
            ]
        )
        == 0
    )
    return json.loads(output.read_text())


@pytest.mark.slow
def test_a_checkpoint_evaluates_like_the_export_of_the_same_weights(reference_run, tmp_path, dataset_uri):
    run_uri, config = reference_run["run_uri"], reference_run["config"]
    step_40 = f"{run_uri}/checkpoints/step_00000040"
    copy_config, copy_uri = run_config(tmp_path, dataset_uri, "copy")
    shutil.copytree(reference_run["run_dir"] / "checkpoints", tmp_path / "copy" / "checkpoints")
    assert main(["export", "--config", str(copy_config), "export.dtype=fp32"]) == 0
    report = _evaluate(
        config, tmp_path, "step40", f"eval.model_uri={step_40}", f"eval.baseline_uri={copy_uri}/export"
    )
    candidate, baseline = report["candidate"], report["baseline"]
    assert candidate["model_uri"] == step_40 and candidate["tokens"] == baseline["tokens"] == 4 * 8 * 32
    assert candidate["eval_loss"] == baseline["eval_loss"]  # an fp32 export holds the same weights
    # The run's own export is bf16 (the default): its weights are rounded, its loss moves a little.
    rounded = _evaluate(config, tmp_path, "bf16", f"eval.model_uri={run_uri}/export")["candidate"]
    assert rounded["eval_loss"] == pytest.approx(candidate["eval_loss"], rel=1e-3)
    assert rounded["eval_loss"] != candidate["eval_loss"]
    print("eval_loss fp32 weights", candidate["eval_loss"], "bf16 export", rounded["eval_loss"])
    # Mid-run evaluation exports the checkpoint first and scores that export: what is promoted
    # if it is picked, rounded like the run's own export of the same step.
    exported = (tmp_path / "mid" / "export").as_uri()
    mid = _evaluate(config, tmp_path, "mid", f"eval.model_uri={step_40}", f"eval.export_uri={exported}")
    assert mid["candidate"]["model_uri"] == exported
    assert mid["candidate"]["eval_loss"] == rounded["eval_loss"]
    assert json.loads((tmp_path / "mid" / "export" / "export.json").read_text())["step"] == 40
    with pytest.raises(
        ConfigError, match=r"eval.model_uri .*/export' is not one: name .../checkpoints/step_<N>"
    ):
        _evaluate(config, tmp_path, "bad", f"eval.model_uri={run_uri}/export", f"eval.export_uri={exported}")
    # The checkpoints/ prefix means the newest valid one (step 40); step 30 holds other weights.
    newest = _evaluate(
        config,
        tmp_path,
        "newest",
        f"eval.model_uri={run_uri}/checkpoints/",
        f"eval.baseline_uri={run_uri}/checkpoints/step_00000030",
    )
    assert newest["candidate"]["eval_loss"] == pytest.approx(candidate["eval_loss"], abs=1e-6)
    assert newest["baseline"]["eval_loss"] != pytest.approx(candidate["eval_loss"], abs=1e-4)


@pytest.mark.slow
def test_an_uncommitted_checkpoint_is_refused_by_name(reference_run, tmp_path, dataset_uri):
    shutil.copytree(reference_run["run_dir"] / "checkpoints", tmp_path / "copy" / "checkpoints")
    (tmp_path / "copy" / "checkpoints" / "step_00000040" / "_COMMITTED").unlink()
    step_40 = (tmp_path / "copy" / "checkpoints" / "step_00000040").as_uri()
    with pytest.raises(RuntimeError, match=f"checkpoint {step_40} cannot be used: no _COMMITTED marker"):
        _evaluate(reference_run["config"], tmp_path, "bad", f"eval.model_uri={step_40}")
    # The prefix falls back to the newest committed checkpoint, step 30.
    fallback = _evaluate(
        reference_run["config"],
        tmp_path,
        "fallback",
        f"eval.model_uri={(tmp_path / 'copy' / 'checkpoints').as_uri()}",
        f"eval.baseline_uri={reference_run['run_uri']}/checkpoints/step_00000030",
    )
    assert fallback["candidate"]["eval_loss"] == pytest.approx(fallback["baseline"]["eval_loss"], abs=1e-6)


class NextToken(torch.nn.Module):
    """A model whose greedy answer is known: after token t it says t + 1 (mod the vocabulary)."""

    def __init__(self, vocab: int = 64):
        super().__init__()
        self.vocab = vocab
        self.inputs: list[tuple[int, ...]] = []

    def forward(self, tokens):
        self.inputs.append(tuple(tokens.shape))
        return torch.nn.functional.one_hot((tokens + 1) % self.vocab, self.vocab).float()


def test_each_eval_prompt_is_answered_greedily_as_long_as_its_reference_within_the_bounds(tmp_path):
    from trainer.evaluate import record_answers
    from trainer.evaluate.scores import Answer, answer_figures, answer_lengths

    records = [  # (prompt, response): NextToken answers a prompt ending in t with t+1, t+2, ...
        ([1, 2, 3], [4, 5]),  # exact
        ([10, 11], [12, 13, 14, 15]),  # exact, but longer than max_new_tokens 3: its first 3 tokens
        ([20, 21, 22], [23, 30]),  # half right: exact 0, F1 1/2
        ([40, 41, 42, 43, 44, 45, 46, 47], [48]),  # the prompt fills the context (seq_len 7): no answer
        ([50, 51, 52], [53, 54]),  # the first's shape (as the third's): one batch, unpadded
    ]
    tokens, rows = [], []
    for prompt, response in records:
        rows.append((len(tokens), len(prompt) + len(response), len(prompt)))
        tokens += prompt + response
    path = tmp_path / "eval.bin"
    np.asarray(tokens, dtype=np.uint16).tofile(path)
    rows = np.asarray(rows, dtype=np.int64)
    assert answer_lengths(rows, 7, 3).tolist() == [2, 3, 2, 0, 2]
    model = NextToken()
    answered = record_answers(model, TokenStream([path], "uint16"), rows, 7, 3, batch_size=8)
    assert answered[2] == Answer([23, 24], [23, 30]) and answered[3] is None  # what it said, and the truth
    exact, f1 = answer_figures(answered)
    assert exact[[0, 1, 2, 4]].tolist() == [1.0, 1.0, 0.0, 1.0] and np.isnan(exact[3])
    assert f1[2] == pytest.approx(0.5) and np.isnan(f1[3])
    # Records of one prompt and answer length share a batch; no batch is padded.
    assert sorted(model.inputs) == [(1, 2), (1, 3), (1, 4), (3, 3), (3, 4)]
    one_at_a_time = record_answers(NextToken(), TokenStream([path], "uint16"), rows, 7, 3, batch_size=1)
    assert one_at_a_time == answered
    first_batch = record_answers(NextToken(), TokenStream([path], "uint16"), rows, 7, 3, 2, max_batches=1)
    assert [a is not None for a in first_batch] == [True, True, False, False, False]
