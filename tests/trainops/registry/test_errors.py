"""The registry's errors: one base class to catch, and messages that say what to do."""

from __future__ import annotations

import pytest

from trainops.registry.errors import (
    ProductionMovedError,
    PromotionError,
    RegateRejected,
    RollbackConflict,
    version_label,
)


def test_versions_are_named_v_n_or_none():
    assert version_label(3) == "v3"
    assert version_label(None) == "(none)"


def test_production_moved_says_to_re_run_against_the_new_version():
    moved = ProductionMovedError("demo-lm", 1, 2, pointer={"version": 2})
    assert str(moved) == (
        "production of 'demo-lm' moved from v1 to v2 while this run was gated; re-run to evaluate against v2"
    )
    assert (moved.expected_version, moved.current_version, moved.pointer) == (1, 2, {"version": 2})
    gone = ProductionMovedError("demo-lm", 4, None)
    assert str(gone) == (
        "production of 'demo-lm' moved from v4 to (none) while this run was gated; "
        "re-run to evaluate with no production model"
    )


def test_production_moved_with_a_reason_says_how_to_evaluate_again():
    moved = ProductionMovedError("demo-lm", None, 3, reason="v3 has no model card to compare with")
    assert str(moved) == (
        "production of 'demo-lm' moved from (none) to v3 while this run was gated, and v3 has no "
        "model card to compare with; the candidate must be evaluated against v3: clear this DAG "
        "run's evaluate task (it evaluates against the current production model) or trigger a new run"
    )
    assert moved.reason == "v3 has no model card to compare with"


@pytest.mark.parametrize(
    "error",
    [
        ProductionMovedError("m", 1, 2),
        RegateRejected("fails", {"approved": False}),
        RollbackConflict("moved"),
    ],
)
def test_every_registry_error_is_a_promotion_error(error):
    # The CLI and the operators catch PromotionError alone to report any of them.
    assert isinstance(error, PromotionError)


def test_a_rejected_regate_carries_its_decision():
    decision = {"approved": False, "production_version": 3, "checks": []}
    assert RegateRejected("fails against v3", decision).decision is decision
