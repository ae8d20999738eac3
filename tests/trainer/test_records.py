"""Record tasks (``sft``): one record, one sample, padded, its prompt and padding without loss;
the sample order is the records', so resume replays the same batches."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tests.trainer.helpers import write_sft_dataset
from trainer.config import ConfigError, load_config
from trainer.contract import IGNORE_INDEX
from trainer.data import DataError, TokenStream, inputs_and_targets
from trainer.records import RecordBatches, check_records, read_records, sample
from trainer.step import forward_backward
from trainer.storage import open_storage


def test_a_sample_is_the_record_padded_and_only_its_response_is_labelled():
    tokens = np.array([10, 11, 12, 20, 21, 256])  # a prompt of 3, a response of 2, end of text
    got = sample(tokens, 3, seq_len=7)
    assert got[0].tolist() == [10, 11, 12, 20, 21, 256, 0, 0]
    assert got[1].tolist() == [IGNORE_INDEX] * 3 + [20, 21, 256] + [IGNORE_INDEX] * 2
    inputs, targets = inputs_and_targets(torch.from_numpy(got[None]))
    # position 2 (the prompt's last token) predicts the response's first: the first scored target
    assert inputs[0].tolist() == [10, 11, 12, 20, 21, 256, 0]
    assert targets[0].tolist() == [IGNORE_INDEX] * 2 + [20, 21, 256] + [IGNORE_INDEX] * 2
    truncated = sample(tokens, 3, seq_len=3)  # longer than a sample: cut, never split
    assert truncated.tolist() == [[10, 11, 12, 20], [IGNORE_INDEX] * 3 + [20]]


def test_the_loss_is_the_responses_mean_and_no_gradient_reaches_the_prompt():
    torch.manual_seed(0)
    vocab = 300

    class Logits(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(vocab, vocab)

        def forward(self, tokens):
            self.logits = self.embed(tokens)
            self.logits.retain_grad()
            return self.logits

    model = Logits()
    batch = torch.from_numpy(
        np.stack([sample(np.array([1, 2, 3, 4, 5, 6]), 4, 7), sample(np.array([7, 8, 9, 10]), 1, 7)])
    )
    inputs, targets = inputs_and_targets(batch)
    loss = forward_backward(model, [(inputs, targets)], 1, masked=True)
    scored = targets != IGNORE_INDEX
    by_hand = F.cross_entropy(model.logits.detach()[scored], targets[scored])
    assert loss.item() == pytest.approx(by_hand.item(), rel=1e-6)
    grad = model.logits.grad
    assert grad[~scored].abs().max().item() == 0.0  # the prompt and the padding carry no loss
    assert (grad[scored].abs().sum(-1) > 0).all()
    # a micro-batch with nothing to score adds nothing (not NaN)
    nothing = torch.full_like(targets, IGNORE_INDEX)
    assert forward_backward(model, [(inputs, nothing)], 1, masked=True).item() == 0.0


def test_record_batches_split_the_global_batch_over_ranks_in_the_records_order(tmp_path):
    uri = write_sft_dataset(tmp_path / "sft", train_records=40, eval_records=4)
    storage = open_storage(uri)
    manifest = storage.get_json(f"{uri}/manifest.json")
    rows = read_records(storage, uri, manifest, "train")
    stream = TokenStream([tmp_path / "sft" / "train" / "00000.bin"], "uint16")
    check_records(rows, len(stream), uri)
    whole = RecordBatches(stream, rows, "sft", 128, seed=3, micro_batch_size=4, world_size=1, rank=0)
    ranks = [
        RecordBatches(stream, rows, "sft", 128, seed=3, micro_batch_size=2, world_size=2, rank=r)
        for r in (0, 1)
    ]
    assert torch.equal(whole.micro_batch(8, 0), torch.cat([r.micro_batch(8, 0) for r in ranks]))
    batch = whole.micro_batch(0, 0)
    assert batch.shape == (4, 2, 129)
    first = int(whole.order.sample_id(0))
    start, length, prompt = (int(v) for v in rows[first])
    assert batch[0, 0, :length].tolist() == stream.read(start, start + length).tolist()
    assert (batch[0, 1, :prompt] == IGNORE_INDEX).all() and (
        batch[0, 1, prompt:length] == batch[0, 0, prompt:length]
    ).all()


def test_records_outside_the_stream_or_without_a_response_are_refused_naming_the_record():
    with pytest.raises(DataError, match=r"record 1 of file:///d is \(start 5, length 3, aux 3\)"):
        check_records(np.array([[0, 5, 2], [5, 3, 3]]), 100, "file:///d")
    with pytest.raises(DataError, match=r"record 0 .* in a stream of 4 tokens"):
        check_records(np.array([[0, 5, 2]]), 4, "file:///d")


def test_a_dataset_staged_for_another_task_is_refused_naming_both(world_of_one, tmp_path):
    from tests.trainer.test_train import start

    uri = write_sft_dataset(tmp_path / "sft", train_records=40, eval_records=4)
    with pytest.raises(ConfigError, match=r"task.kind='causal_lm', but dataset .* was staged for task 'sft'"):
        start(tmp_path, uri, world_of_one, 1)
    training, _ = start(tmp_path, uri, world_of_one, 1, "task.kind=sft")
    assert isinstance(training.batches, RecordBatches) and training.batches.masked
    with pytest.raises(ConfigError, match=r"task.kind='classification' trains a Hugging Face encoder"):
        load_config(None, ["run_uri=file:///r", "data_uri=file:///d", "task.kind=classification"])


def test_an_sft_model_is_evaluated_on_its_eval_records_responses_only(tmp_path):
    """The eval loss is the mean cross-entropy of the eval records' response tokens, each record
    run alone through the model: padding and batching change nothing, prompts count for nothing."""
    from trainer.evaluate import run_evaluate
    from trainer.export.folder import load_model, write_export
    from trainer.models.builder import build_preset
    from trainer.presets import PRESETS

    uri = write_sft_dataset(tmp_path / "sft", train_records=8, eval_records=12)
    torch.manual_seed(0)
    built = build_preset(PRESETS["tiny"].with_vocab(257))
    export_uri = (tmp_path / "export").as_uri()
    write_export(
        open_storage(export_uri),
        export_uri,
        built.model.state_dict(),
        built,
        step=1,
        data_uri=uri,
        run_uri="file:///r",
        precision="fp32",
        dtype="fp32",
    )
    config = load_config(
        None,
        [
            f"run_uri={(tmp_path / 'run').as_uri()}",
            f"data_uri={uri}",
            "task.kind=sft",
            "train.seq_len=96",
            f"eval.model_uri={export_uri}",
            "eval.batch_size=5",
            "eval.metrics=examples.team_metrics:word_f1",  # a team's scorer, on the answers as text
        ],
    )
    whole = run_evaluate(config)
    report = whole["candidate"]
    model, _ = load_model(open_storage(export_uri), export_uri)
    storage = open_storage(uri)
    manifest = storage.get_json(f"{uri}/manifest.json")
    rows = read_records(storage, uri, manifest, "eval")
    stream = TokenStream([tmp_path / "sft" / "eval" / "00000.bin"], "uint16")
    losses = []
    with torch.no_grad():
        for start, length, prompt in rows.tolist():
            tokens = torch.from_numpy(stream.read(start, start + length))[None]
            ce = F.cross_entropy(model(tokens[:, :-1])[0], tokens[0, 1:], reduction="none")
            losses += ce[prompt - 1 :].tolist()  # the targets from the response's first token on
    assert report["tokens"] == len(losses)
    assert report["eval_loss"] == pytest.approx(sum(losses) / len(losses), rel=1e-5)
    # the team's scorer saw the decoded answers: a random model's answers are not the references
    assert report["user_metrics"] == dict.fromkeys(
        ("word_exact_match", "word_f1"), "examples.team_metrics:word_f1"
    )
    assert 0 <= report["word_exact_match"] <= report["word_f1"] <= 1
    # each record's figures, kept for a paired comparison: their means are the report's
    kept = storage.get_json(whole["records_uri"])["candidate"]
    assert sum(kept["loss_sum"]) / sum(kept["loss_tokens"]) == pytest.approx(report["eval_loss"])
    answered = [e for e in kept["exact"] if e is not None]
    assert len(answered) == report["answers"] and np.mean(answered) == pytest.approx(report["exact_match"])
