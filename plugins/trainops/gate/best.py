"""Which scored checkpoint is a run's candidate: the best by a named metric; pure.

Mid-run evaluation (:class:`~trainops.operators.EvaluateCheckpointsOperator`) scores every Nth
checkpoint of a run, and its last one, each as the export that would be promoted. The pick is
the best of them by one metric, in that metric's direction (``trainops.gate.metrics``); on a
tie the later step wins (it saw more data for the same score).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from trainops.gate.errors import GateConfigError
from trainops.gate.metrics import HIGHER, missing_metric_hint


@dataclass(frozen=True)
class CheckpointScore:
    """One scheduled checkpoint's outcome: its candidate scores (the evaluation report's
    ``candidate``), or why it was skipped."""

    step: int
    scores: Mapping[str, Any] | None
    export_uri: str | None
    skipped: str | None = None


@dataclass(frozen=True)
class Pick:
    """The picked checkpoint, the metric that decided and every checkpoint's figure."""

    step: int
    export_uri: str
    metric: str
    direction: str
    value: float
    last_step: int
    ranking: tuple[tuple[int, float | None, str | None], ...]  # (step, figure, skipped why)

    @property
    def why(self) -> str:
        """One sentence: which step, by which figure, against the others."""
        way = "higher" if self.direction == HIGHER else "lower"
        others = ", ".join(
            f"step {step} {'skipped' if value is None else f'{value:.4g}'}" for step, value, _ in self.ranking
        )
        last = (
            "the last checkpoint" if self.step == self.last_step else f"not the last (step {self.last_step})"
        )
        return (
            f"step {self.step} has the best {self.metric} ({self.value:.4g}; {way} is better) of "
            f"{sum(1 for _, v, _ in self.ranking if v is not None)} scored checkpoints ({others}): {last}"
        )

    def document(self) -> dict[str, Any]:
        """The pick as stored (``<run>/eval/checkpoint_pick.json``) and shown on the card."""
        return {
            "step": self.step,
            "export_uri": self.export_uri,
            "metric": self.metric,
            "direction": self.direction,
            "value": self.value,
            "last_step": self.last_step,
            "why": self.why,
            "checkpoints": [
                {"step": step, "value": value, **({"skipped": skipped} if skipped else {})}
                for step, value, skipped in self.ranking
            ],
        }


def _figure(score: CheckpointScore, metric: str) -> float:
    value = (score.scores or {}).get(metric)
    if value is None:
        value = ((score.scores or {}).get("user_metrics") or {}).get(metric)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise GateConfigError(
            f"checkpoint step {score.step} has no finite {metric} ({value!r}): "
            f"{missing_metric_hint(metric, score.scores or {})}; pick by a metric its evaluation reports"
        )
    return float(value)


def pick_best(scores: Sequence[CheckpointScore], metric: str, direction: str) -> Pick:
    """The best scored checkpoint by ``metric`` (``direction``: ``trainops.gate.metrics``'s).

    Raises GateConfigError when no checkpoint was scored, or a scored one lacks the metric."""
    ordered = sorted(scores, key=lambda s: s.step)
    scored = [s for s in ordered if s.skipped is None]
    if not scored:
        skipped = "; ".join(f"step {s.step}: {s.skipped}" for s in ordered) or "none was due"
        raise GateConfigError(
            f"no checkpoint of the run was scored ({skipped}); nothing to pick {metric} from"
        )
    figures = {s.step: _figure(s, metric) for s in scored}
    sign = 1.0 if direction == HIGHER else -1.0
    best = max(scored, key=lambda s: (sign * figures[s.step], s.step))  # a tie: the later step
    if best.export_uri is None:
        raise GateConfigError(f"checkpoint step {best.step} was scored without an export; score it again")
    return Pick(
        step=best.step,
        export_uri=best.export_uri,
        metric=metric,
        direction=direction,
        value=figures[best.step],
        last_step=ordered[-1].step,
        ranking=tuple((s.step, figures.get(s.step), s.skipped) for s in ordered),
    )
