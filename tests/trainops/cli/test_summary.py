"""The demo's closing summary, as a person reads it after a run."""

from __future__ import annotations

import json
from urllib.parse import quote

from tests.trainops.registry.helpers import promote_runs
from trainer.contract import model_version_prefix, production_pointer
from trainer.storage import open_storage
from trainops.cli.summary import collect, render
from trainops.links import home_url, report_url

STAGE = {
    "dataset_name": "demo-text",
    "version": "3f2a",
    "rows": 12000,
    "train_tokens": 1_500_000,
    "eval_tokens": 80_000,
    "reused": False,
    "uri": "file:///s/datasets/demo-text/3f2a",
}
TRAIN = {
    "steps": 40,
    "attempts": 2,
    "preemptions": 1,
    "steps_lost": 3,
    "final_loss": 2.51234,
    "run_uri": "file:///s/runs/trainops_demo/r1/train",
    "cost": {  # the part of a RunCost (trainops.cost.accounting) that the summary shows
        "goodput": 0.2793,
        "recovery_s": [16.42],
        "billed_gpu_hours": 0.02214,
        "productive_gpu_hours": 0.00618,
        "lost_gpu_hours": 0.00791,
        "cost": 0.031,
        "on_demand_cost": 0.0886,
        "savings": 0.0576,
    },
}
EVALUATE = {
    "candidate": {"eval_loss": 2.6, "perplexity": 13.46, "tokens": 4096},
    "production": {"eval_loss": 2.7},
    "production_version": 1,
}
GATE = {
    "approved": True,
    "checks": [{"name": "loss cap", "passed": True}, {"name": "no regression", "passed": True}],
}


def facts(**overrides) -> dict:
    return {
        "model_name": "demo-lm",
        "root": "file:///s",
        "stage": STAGE,
        "train": TRAIN,
        "evaluate": EVALUATE,
        "gate": GATE,
        "promote": {"version": 2, "previous_version": 1},
        "production": {"uri": "file:///s/models/demo-lm/versions/2"},
        **overrides,
    }


def test_restarts_in_place_are_named_only_where_there_were_some():
    restarted = {**TRAIN, "restarts_in_place": 1}
    assert (
        "training         40 steps in 2 attempt(s); preemptions survived 1, restarts in place 1, steps lost 3"
        in render(facts(train=restarted)).splitlines()
    )


def test_a_promoted_run_is_summed_up_line_by_line():
    assert render(facts()).splitlines() == [
        "",
        "trainops demo summary",
        "---------------------",
        "dataset          demo-text version 3f2a: 12,000 rows, 1,500,000 train / 80,000 eval tokens, "
        "staged and validated",
        "training         40 steps in 2 attempt(s); preemptions survived 1, steps lost 3",
        "final train loss 2.5123",
        "goodput          27.9% (productive / billed GPU time); recovery 16.4 s (signal to the next "
        "attempt's first step)",
        "GPU-hours        0.0221 billed, 0.0062 productive, 0.0079 lost to interruptions",
        "cost (estimate)  $0.03 spot, $0.09 on-demand equivalent: spot saved $0.06 (65%)",
        "eval loss        2.6000 (perplexity 13.46, 4,096 tokens); production v1: 2.7000",
        "gate             approved (loss cap: pass, no regression: pass)",
        "promoted         demo-lm v2 (was v1)",
        "artifacts",
        "  dataset        file:///s/datasets/demo-text/3f2a",
        "  run            file:///s/runs/trainops_demo/r1/train",
        "  production     file:///s/models/demo-lm/versions/2",
        "reports          make airflow, then open in a browser (log in as admin)",
        "  run report     http://localhost:8080/trainops/report?uri=file%3A%2F%2F%2Fs%2Fruns%2Ftrainops_demo"
        "%2Fr1%2Ftrain%2Fjob.json",
        "  home           http://localhost:8080/trainops/",
        "look further",
        "  python -m trainops status latest   the newest run's state",
        "  python -m trainops report latest   its report's URL (--open opens it)",
        "  python -m trainops models demo-lm  production and its history: who and why",
    ]


def test_the_report_urls_are_the_report_apps_under_make_airflow():
    lines = render(facts()).splitlines()
    run_report = next(line for line in lines if line.startswith("  run report     "))
    assert run_report.split()[-1] == report_url(f"{TRAIN['run_uri']}/job.json", "http://localhost:8080")
    assert f"  home           {home_url('http://localhost:8080')}" in lines


def test_the_first_promotion_and_a_reused_dataset_say_so():
    text = render(
        facts(
            stage={**STAGE, "reused": True},
            evaluate={**EVALUATE, "production": None, "production_version": None},
            promote={"version": 1, "previous_version": None},
        )
    )
    assert "eval tokens, reused (unchanged input)" in text
    assert "4,096 tokens); no production model yet" in text
    assert "promoted         demo-lm v1 (first production version)" in text


def test_a_classifier_is_summed_up_by_its_accuracy_and_f1_over_its_records():
    classifier = {
        "eval_loss": 0.005,
        "perplexity": 1.005,
        "tokens": 182,
        "records": 182,
        "accuracy": 0.9945,
        "f1_macro": 0.9951,
    }
    text = render(facts(evaluate={**EVALUATE, "candidate": classifier}))
    assert (
        "eval loss        0.0050 (accuracy 99.5%, macro F1 0.995, 182 records); production v1: 2.7000" in text
    )


def test_an_instruction_tuned_model_is_summed_up_by_its_greedy_answers():
    tuned = {"eval_loss": 0.03, "perplexity": 1.03, "tokens": 603, "exact_match": 0.985, "token_f1": 0.99}
    text = render(facts(evaluate={**EVALUATE, "candidate": {**tuned, "answers": 201}}))
    assert (
        "eval loss        0.0300 (exact match 98.5%, token F1 0.990 over 201 greedy answers); production v1"
        in text
    )


def test_a_picked_checkpoint_is_named_before_its_evaluation():
    pick = {
        "step": 90,
        "why": "step 90 has the best eval_loss (2.1; lower is better) of 4 scored checkpoints (...)",
    }
    text = render(facts(evaluate_checkpoints={"checkpoint_pick": pick}))
    lines = text.splitlines()
    at = lines.index(
        "checkpoint       picked step 90 has the best eval_loss (2.1; lower is better) of 4 scored checkpoints (...)"
    )
    assert lines[at + 1].startswith("eval loss        2.6000")
    assert "checkpoint " not in render(facts())


def test_a_rejected_candidate_promotes_nothing():
    checks = [{"name": "loss cap", "passed": False}]
    text = render(facts(gate={"approved": False, "checks": checks}, promote=None, production=None))
    assert "gate             REJECTED (loss cap: FAIL)" in text
    assert "promoted         nothing: the gate rejected the candidate" in text
    assert "production     " not in text


def test_nothing_promoted_says_why_from_the_runs_note():
    identical = (
        "NOT PROMOTED: demo-lm is identical to production v1 (same weights sha256 ab12); "
        "nothing new to publish; production unchanged."
    )
    text = render(facts(promote=None, run_note=identical))
    assert f"promoted         nothing: {identical}" in text
    # after the gate's approval note, promote's part is the one that says why
    approved = (
        "APPROVED: demo-lm passed 2 of 2 gate checks (against production v1), decided on eval_loss.\n- x"
    )
    text = render(facts(promote=None, run_note=f"{approved}\n\n{identical}"))
    assert f"promoted         nothing: {identical}" in text
    rejected = (
        "REJECTED: demo-lm failed 1 of 2 gate checks (against production v1); promote skipped\n- loss cap"
    )
    text = render(facts(gate={"approved": False, "checks": []}, promote=None, run_note=rejected))
    assert (
        "promoted         nothing: REJECTED: demo-lm failed 1 of 2 gate checks (against production v1)"
        in text
    )
    assert "- loss cap" not in text  # the first line only: the gate line lists the checks


def test_a_run_without_an_interruption_or_a_bill_says_so():
    calm = {**TRAIN["cost"], "recovery_s": [], "cost": 0.0042, "on_demand_cost": 0.012, "savings": 0.0078}
    text = render(facts(train={**TRAIN, "cost": calm}))
    assert "recovery none (no interruption)" in text
    assert "cost (estimate)  $0.0042 spot, $0.01 on-demand equivalent: spot saved $0.0078 (65%)" in text
    unpriced = render(facts(train={**TRAIN, "cost": None}))
    assert "cost             not recorded (the train task's log says why); no goodput either" in unpriced
    assert "GPU-hours" not in unpriced


NOTHING_RAN = {
    "stage": None,
    "train": None,
    "evaluate": None,
    "gate": None,
    "promote": None,
    "production": None,
}


def test_data_rejected_by_staging_trains_nothing():
    lines = render(facts(**NOTHING_RAN)).splitlines()
    assert lines[3] == (
        "dataset          REJECTED by staging (the stage task's log lists the failed expectations); "
        "nothing was trained or written"
    )
    assert (
        "artifacts" not in lines
        and lines[4] == "reports          make airflow, then open in a browser (log in as admin)"
    )
    assert lines[5] == "  home           http://localhost:8080/trainops/"


def test_data_rejected_by_staging_is_named_expectation_by_expectation(file_root):
    storage = open_storage(file_root)
    report = f"{file_root}/datasets/demo-text/9c1e/validation.json"
    failed = [
        {
            "expectation": "expect_column_values_to_not_be_null",
            "column": "id",
            "unexpected_count": 2,
            "sample_rows": [3],
        },
        {
            "expectation": "expect_column_value_lengths_to_be_between",
            "column": "text",
            "unexpected_count": 3,
            "sample_values": [""],
            "sample_ids": ["n000-0000005"],
        },
    ]
    storage.put_json(report, {"success": False, "failed": failed, "rows": 4000})
    facts = collect(storage, file_root, {}, "demo-lm", validation_uri=report)
    lines = render(facts).splitlines()
    assert lines[3:6] == [
        "dataset          REJECTED by staging; nothing was trained or written",
        "staging rejected the data: id: expect_column_values_to_not_be_null failed for 2 rows (e.g. row 3)",
        "staging rejected the data: text: expect_column_value_lengths_to_be_between failed for 3 rows (e.g. '')",
    ]
    assert f"  validation     http://localhost:8080/trainops/report?uri={quote(report, safe='')}" in lines
    # nothing trained: `latest` would be an earlier run's, so the summary points at the runs
    assert "  python -m trainops runs            the training runs so far and their outcomes" in lines
    assert not [line for line in lines if "latest" in line]
    # a report that cannot be read: the line that says where to look instead
    gone = collect(storage, file_root, {}, "demo-lm", validation_uri=f"{file_root}/nowhere/validation.json")
    assert (
        render(gone).splitlines()[3].startswith("dataset          REJECTED by staging (the stage task's log")
    )


def test_collect_reads_the_production_pointer_beside_the_task_results(file_root):
    storage = open_storage(file_root)
    results = {"stage": STAGE, "train": TRAIN, "gate": GATE, "other": "ignored"}
    before = collect(storage, file_root, results, "demo-lm")
    assert before["production"] is None and before["evaluate"] is None
    assert before["stage"] is STAGE and "other" not in before
    promote_runs(storage, file_root, 2)
    after = collect(storage, file_root, results, "demo-lm")
    assert after["production"]["uri"] == model_version_prefix(file_root, "demo-lm", 2)


def test_a_damaged_production_pointer_is_a_line_of_the_summary_not_a_crash(file_root):
    storage = open_storage(file_root)
    promote_runs(storage, file_root, 1)
    uri = production_pointer(file_root, "demo-lm")
    pointer = storage.get(uri)
    for damage, said in (
        (pointer[: len(pointer) // 2], f"{uri} is not valid JSON ("),
        (b"[1, 2]", f"{uri} should hold a JSON object (a production pointer), got a list of 2 item(s)"),
        (json.dumps({**json.loads(pointer), "version": "1"}).encode(), f"{uri}: field 'version' should be"),
    ):
        storage.put(uri, damage)
        facts = collect(storage, file_root, {"stage": STAGE, "train": TRAIN, "gate": GATE}, "demo-lm")
        assert facts["production"] is None
        (line,) = [line for line in render(facts).splitlines() if line.startswith("  production")]
        assert line.startswith(f"  production     unreadable: {said}"), line
        assert line.endswith("the production pointer is damaged: restore it from its history or delete it")
