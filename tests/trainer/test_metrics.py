"""``metrics.jsonl`` as rank 0 writes it: every attempt's records kept, rewritten at flush points."""

import json

from trainer.contract import metrics_by_step, metrics_records
from trainer.metrics import MetricsLog
from trainer.storage import open_storage


def test_metrics_keep_earlier_attempts_and_readers_take_the_last(tmp_path):
    uri = (tmp_path / "metrics.jsonl").as_uri()
    storage = open_storage(uri)
    first = MetricsLog(storage, uri, attempt=1, flush_every=2)
    for step in (1, 2, 3):
        first.add(step=step, loss=5.0 - step, lr=1e-3, tokens_per_s=10.0, time=0.0)
    assert [r["step"] for r in metrics_records((tmp_path / "metrics.jsonl").read_text())] == [
        1,
        2,
    ]  # step 3 not flushed
    first.flush()
    second = MetricsLog(storage, uri, attempt=2, flush_every=1)  # resumed from step 2
    second.add(step=3, loss=0.5, lr=1e-3, tokens_per_s=10.0, time=0.0)
    records = metrics_records(
        (tmp_path / "metrics.jsonl").read_text() + '{"step": 9, "lo'
    )  # a torn tail is skipped
    assert [(r["step"], r["attempt"]) for r in records] == [(1, 1), (2, 1), (3, 1), (3, 2)]
    by_step = metrics_by_step(records)
    assert (by_step[3]["attempt"], by_step[3]["loss"], by_step[2]["attempt"]) == (2, 0.5, 1)
    assert set(json.loads(json.dumps(records[0]))) == {
        "step",
        "loss",
        "lr",
        "tokens_per_s",
        "attempt",
        "time",
    }
