"""The metrics an evaluation reports, and which way each one is better; pure.

One table (:data:`BUILTIN`) says, for every metric ``EvaluateModelOperator`` can report: how a
page labels it, whether higher or lower is better, and the tasks whose evaluation reports it.
The gate takes a check's metric name and default direction from it, refuses a name it lacks
(listing the known ones) and a direction against the metric's, and the model card and the
version README list the metrics an evaluation holds in its order.

=============  ============  ================  ====================================================
metric         better        tasks             what
=============  ============  ================  ====================================================
accuracy       higher        classification    share of records whose top label is the right one
f1_macro       higher        classification    mean over the labels of each label's F1
auroc          higher        classification    two labels only: the chance a positive record
                                               outscores a negative one
calibration_   lower         classification    expected calibration error: how far the top
error                                          probability is from the accuracy, over 10 bins
exact_match    higher        sft               share of greedy answers equal to their reference
token_f1       higher        sft               mean F1 of each answer's tokens against the reference's
eval_loss      lower         every task        mean loss over the scored tokens (sft: responses;
                                               classification: one cross-entropy per record)
perplexity     lower         causal_lm, sft    ``exp(eval_loss)``
=============  ============  ================  ====================================================

A team's own metrics (``EvaluateModelOperator(metrics=...)``, the trainer's ``eval.metrics``)
are not in the table: the evaluation reports them beside these (its ``user_metrics`` names the
function that gave each), and a gate check on one says which way is better (``direction``).
Pages show them after the built-in ones, by name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from trainer.contract import (
    TASK_CAUSAL_LM,
    TASK_CLASSIFICATION,
    TASK_KINDS,
    TASK_SFT,
    metric_name_problem,
)
from trainops.gate.errors import GateConfigError

LOWER, HIGHER = "lower_is_better", "higher_is_better"
DIRECTIONS = (LOWER, HIGHER)


@dataclass(frozen=True)
class Metric:
    """A metric an evaluation reports: its label on pages, its direction, who reports it."""

    name: str
    label: str
    direction: str  # "" for a team's own metric on a page: its gate check says which way
    tasks: tuple[str, ...]


BUILTIN: dict[str, Metric] = {
    m.name: m
    for m in (
        # A task's own metrics first: pages headline the first two an evaluation holds.
        Metric("accuracy", "Accuracy", HIGHER, (TASK_CLASSIFICATION,)),
        Metric("f1_macro", "Macro F1", HIGHER, (TASK_CLASSIFICATION,)),
        Metric("auroc", "AUROC", HIGHER, (TASK_CLASSIFICATION,)),
        Metric("calibration_error", "Calibration error (ECE)", LOWER, (TASK_CLASSIFICATION,)),
        Metric("exact_match", "Exact match", HIGHER, (TASK_SFT,)),
        Metric("token_f1", "Token F1", HIGHER, (TASK_SFT,)),
        Metric("eval_loss", "Eval loss", LOWER, TASK_KINDS),
        Metric("perplexity", "Perplexity", LOWER, (TASK_CAUSAL_LM, TASK_SFT)),
    )
}
METRIC_NAMES = tuple(BUILTIN)
USER = "a team's own (eval.metrics)"


# Why a name cannot name a team's own metric (None: it can): the trainer's rule, one for both.
user_metric_problem = metric_name_problem


def user_metrics_of(scores: Mapping[str, object] | None) -> list[str]:
    """The team's own metrics an evaluation's scores hold, in the report's order."""
    named = scores.get("user_metrics") if isinstance(scores, Mapping) else None
    return [n for n in named if user_metric_problem(n) is None] if isinstance(named, Mapping) else []


def known_metrics() -> str:
    """The known names with their direction and tasks, for a message."""
    return "; ".join(
        f"{m.name} ({m.direction.split('_')[0]} is better; {', '.join(m.tasks)})" for m in BUILTIN.values()
    )


def shown_metrics(*scores: Mapping[str, object] | None) -> list[Metric]:
    """The metrics to show for these scores (a candidate's, production's): each that any of them
    holds, in :data:`BUILTIN`'s order, then the team's own (no direction: "")."""
    present = [s for s in scores if isinstance(s, Mapping)]
    shown = [m for m in BUILTIN.values() if any(s.get(m.name) is not None for s in present)]
    own = dict.fromkeys(name for s in present for name in user_metrics_of(s))
    return shown + [Metric(name, name, "", (USER,)) for name in own]


def better(metric: Metric, ours: float, theirs: float) -> bool | None:
    """Whether ``ours`` is at least as good as ``theirs`` in the metric's direction (None: a
    metric without one)."""
    if metric.direction not in DIRECTIONS:
        return None
    return ours <= theirs if metric.direction == LOWER else ours >= theirs


def missing_metric_hint(metric: str, scores: Mapping[str, object]) -> str:
    """Why an evaluation lacks ``metric``: which tasks report it, and what this one holds."""
    known = BUILTIN.get(metric)
    held = ", ".join(m.name for m in shown_metrics(scores)) or "none"
    if known:
        which = f"{metric} is reported for {', '.join(known.tasks)} only"
    else:
        which = (
            f"{metric} is not a built-in metric, and no scorer of this evaluation returned it "
            "(EvaluateModelOperator's metrics, the trainer's eval.metrics)"
        )
    return f"{which}; this evaluation holds {held}"


def check_direction(where: str, metric: object, direction: object) -> str:
    """A gate check's metric's direction: a built-in metric's own (a ``direction`` given must
    agree), or the one a check on a team's own metric declares; a GateConfigError naming the
    check (``where``), listing the known metrics, otherwise."""
    if direction is not None and direction not in DIRECTIONS:
        raise GateConfigError(f"{where} has unknown direction {direction!r}; use one of {list(DIRECTIONS)}")
    if metric in BUILTIN:
        own = BUILTIN[str(metric)].direction
        if direction is not None and direction != own:
            raise GateConfigError(
                f"{where} says {metric} is {direction}, but {metric} is {own}: "
                "drop 'direction' (the metric's own is used)"
            )
        return own
    problem = user_metric_problem(metric)
    if problem is None and direction is not None:
        return str(direction)
    declare = (
        f"; a team's own metric (EvaluateModelOperator's metrics) needs 'direction': one of {list(DIRECTIONS)}"
        if problem is None
        else f" ({problem})"
    )
    raise GateConfigError(
        f"{where} has unknown metric {metric!r}; the known metrics are {known_metrics()}{declare}"
    )
