"""Re-gating: the pure comparability rules, and a promotion that lost its race re-gating
against the winner on real storage."""

from __future__ import annotations

import logging
import math

import pytest

from tests.trainops.registry.helpers import (
    CHECKS,
    DATA_URI,
    Candidate,
    gate_for,
    promote_candidate,
    rival_first,
    two_candidates_gated_against_v1,
)
from trainer.contract import RunLayout, join, model_version_prefix
from trainer.storage import open_storage
from trainops.gate.checks import decide, validate_checks
from trainops.registry.promotion import ProductionMovedError, RegateRejected, read_production
from trainops.registry.regate import comparability, eval_basis, make_regate, regate, rejected_message

BASIS = {"data_uri": DATA_URI, "seq_len": 64, "max_batches": 0, "batch_size": None}


def card_with(metrics: dict | None = None, **basis) -> dict:
    """A model card as promotion writes it, with its evaluation basis and metrics."""
    return {
        "eval_basis": {**BASIS, **basis},
        "metrics": {"candidate": metrics if metrics is not None else {"eval_loss": 2.8, "tokens": 4096}},
    }


# ------------------------------------------------------------------------------ pure


def test_eval_basis_is_what_the_evaluation_scored():
    config = {
        "data_uri": DATA_URI,
        "train": {"seq_len": 128},
        "eval": {"batch_size": 4, "max_batches": 10},
    }
    assert eval_basis(config) == {"data_uri": DATA_URI, "seq_len": 128, "max_batches": 10, "batch_size": 4}
    # Without a cap every window is scored, whatever the batch size.
    uncapped = {**config, "eval": {"batch_size": 4, "max_batches": 0}}
    assert eval_basis(uncapped)["batch_size"] is None
    assert eval_basis({}) == {"data_uri": None, "seq_len": 64, "max_batches": 0, "batch_size": None}
    assert eval_basis("not a config") == eval_basis({})


def test_matching_bases_and_token_counts_are_comparable():
    assert comparability(BASIS, {"tokens": 4096}, card_with(), 3) is None


@pytest.mark.parametrize(
    "basis, candidate, card, reason",
    [
        (BASIS, {"tokens": 4096}, None, "v3 has no model card to compare with"),
        (
            BASIS,
            {"tokens": 4096},
            {"metrics": {}},
            "v3's card records no evaluation basis (it predates re-gating)",
        ),
        (
            {**BASIS, "data_uri": None},
            {"tokens": 4096},
            card_with(),
            "this run's trainer config names no data_uri",
        ),
        (
            {**BASIS, "seq_len": 128},
            {"tokens": 4096},
            card_with(),
            "v3 was evaluated with seq_len 64, this candidate with 128, so their losses are not comparable",
        ),
        (BASIS, {"tokens": 4096}, {"eval_basis": BASIS}, "v3's card holds no evaluation metrics"),
        (
            BASIS,
            {"tokens": 2048},
            card_with(),
            "v3 was scored on 4096 tokens, this candidate on 2048, so their losses are not comparable",
        ),
    ],
)
def test_incomparable_evaluations_say_why(basis, candidate, card, reason):
    assert comparability(basis, candidate, card, 3) == reason


def test_regate_runs_the_gates_checks_with_the_cards_metrics_as_production():
    checks = validate_checks(CHECKS)
    candidate = {"eval_loss": 2.9, "perplexity": math.exp(2.9), "tokens": 4096}
    decision = regate(checks, candidate, card_with({"eval_loss": 2.5, "tokens": 4096}), 3)
    assert decision["production_version"] == 3 and decision["approved"] is False
    assert decision["against"] == "card of v3 (same evaluation basis)"
    assert decision["decided_at"].endswith("+00:00")
    no_regression = decision["checks"][1]
    assert (no_regression["expected"], no_regression["passed"]) == ("<= 2.5", False)
    assert rejected_message("demo-lm", 1, decision) == (
        "production of 'demo-lm' moved from v1 to v3 while this run was gated; re-gated against "
        "v3, the candidate fails: no regression (observed 2.9, expected <= 2.5; production v3 "
        "eval_loss 2.5, tolerance 0)"
    )
    assert rejected_message("demo-lm", None, decision).startswith(
        "production of 'demo-lm' moved from (none) to v3"
    )


# ------------------------------------------------------------------------ the callable


def test_a_gate_result_without_check_definitions_cannot_be_regated(file_root):
    storage = open_storage(file_root)
    cand = Candidate(storage, file_root, "mine", 2.5)
    gate = gate_for(storage, cand, None, None)
    del gate["check_definitions"]
    regate_against = make_regate(
        storage,
        file_root,
        "demo-lm",
        gate=gate,
        candidate=cand.metrics,
        basis=BASIS,
        log=logging.getLogger("tests.registry"),
    )
    with pytest.raises(ProductionMovedError) as err:
        regate_against({"version": 2})
    assert err.value.reason == "the gate result carries no check definitions to re-run"
    assert (err.value.expected_version, err.value.current_version) == (None, 2)
    [recorded] = storage.get_json(RunLayout(cand.run_uri).eval_gate)["regates"]
    assert (recorded["production_version"], recorded["approved"]) == (2, None)
    assert recorded["reason"] == err.value.reason


def test_production_gone_is_regated_against_no_production_model(file_root):
    storage = open_storage(file_root)
    base = Candidate(storage, file_root, "base", 3.0)
    cand = Candidate(storage, file_root, "mine", 2.5)
    gate = gate_for(storage, cand, base, 1)
    regate_against = make_regate(
        storage,
        file_root,
        "demo-lm",
        gate=gate,
        candidate=cand.metrics,
        basis=BASIS,
        log=logging.getLogger("tests.registry"),
    )
    record = regate_against(None)
    assert record["approved"] is True and record["against"] == "no production model"
    assert record["moved_from"] == 1 and record["production_version"] is None
    assert decide(gate["check_definitions"], cand.metrics, None)["checks"] == record["checks"]


# ------------------------------------------------------------------ re-gate on a lost race


def test_lost_race_regates_against_the_winner_and_promotes_when_still_better(root):
    storage = open_storage(root)
    _, mine, rival, my_gate, rival_gate = two_candidates_gated_against_v1(storage, root, 2.5, 2.8)
    result = promote_candidate(rival_first(storage, root, rival, rival_gate), root, mine, my_gate)
    # I claimed v2 first; the rival took v3 and won the pointer; I re-gated against v3.
    assert (result["version"], result["previous_version"], result["regated_against"]) == (2, 3, [3])
    pointer = read_production(storage, root, "demo-lm")
    assert [(h["version"], h["run_uri"]) for h in pointer["history"]] == [
        (1, join(root, "runs", "retrain", "base", "train")),
        (3, rival.run_uri),
        (2, mine.run_uri),
    ]
    card = storage.get_json(result["card_uri"])
    [regate] = card["gate"]["regates"]
    assert regate["production_version"] == 3 and regate["moved_from"] == 1
    assert regate["approved"] is True
    assert regate["checks"][1]["expected"] == "<= 2.8"  # the rival's loss, from its card
    assert card["gate"]["production_version"] == 1  # what the gate itself compared against
    # The run's gate.json shows the re-gate too.
    assert storage.get_json(my_gate["gate_uri"])["regates"][0]["production_version"] == 3


def test_lost_race_regate_rejection_stops_and_leaves_the_winner(root):
    storage = open_storage(root)
    _, mine, rival, my_gate, rival_gate = two_candidates_gated_against_v1(storage, root, 2.9, 2.5)
    with pytest.raises(RegateRejected) as err:
        promote_candidate(rival_first(storage, root, rival, rival_gate), root, mine, my_gate)
    assert str(err.value) == (
        "production of 'demo-lm' moved from v1 to v3 while this run was gated; re-gated against "
        "v3, the candidate fails: no regression (observed 2.9, expected <= 2.5; production v3 "
        "eval_loss 2.5, tolerance 0)"
    )
    pointer = read_production(storage, root, "demo-lm")
    assert pointer["version"] == 3 and len(pointer["history"]) == 2
    loser = model_version_prefix(root, "demo-lm", 2)
    assert storage.list(loser) == [join(loser, "_claim.json")]
    assert "re-gated against v3" in storage.get_json(join(loser, "_claim.json"))["reason"]
    recorded = storage.get_json(my_gate["gate_uri"])
    assert recorded["approved"] is True  # the gate's own decision stands as it was made
    assert recorded["regates"][0]["approved"] is False


def test_lost_race_against_a_model_evaluated_on_other_data_stops_asking_for_re_evaluation(file_root):
    storage = open_storage(file_root)
    _, mine, rival, my_gate, rival_gate = two_candidates_gated_against_v1(
        storage, file_root, 2.5, 2.8, data_uri="file:///datasets/demo-text/9e9e"
    )
    with pytest.raises(ProductionMovedError) as err:
        promote_candidate(rival_first(storage, file_root, rival, rival_gate), file_root, mine, my_gate)
    message = str(err.value)
    assert message.startswith(
        "production of 'demo-lm' moved from v1 to v3 while this run was "
        "gated, and v3 was evaluated with data_uri "
        "'file:///datasets/demo-text/3f2a', this candidate with "
        "'file:///datasets/demo-text/9e9e'"
    )
    assert "must be evaluated against v3: clear this DAG run's evaluate task" in message
    assert read_production(storage, file_root, "demo-lm")["version"] == 3
    assert storage.get_json(my_gate["gate_uri"])["regates"][0]["reason"].startswith(
        "v3 was evaluated with data_uri"
    )
