"""A team's own metrics (``eval.metrics``), scored on the same eval records as the built-in ones.

Each entry of ``eval.metrics`` names a function (``module:function``, importable in the trainer
image or from its ``PYTHONPATH``), called as::

    function(predictions, references, records) -> {"name": number, ...}

- ``predictions``: what the model said for each scored eval record, in order: a classifier's
  label (a name from the dataset's label set), an ``sft`` model's greedy answer as text (the
  tokenizer's decoding, special tokens left out);
- ``references``: the right answer for each, in the same form;
- ``records``: each record's columns from the dataset's eval index (its ``id`` and slice
  columns; an empty dict where the dataset has no eval index).

It is called once over every scored record, then once per slice value over that value's
records, so its figures are per slice too and slice checks can use them (on a slice it may
return None or ``{}``: no figure there). The figures sit in the
evaluation report beside the built-in ones (``user_metrics`` says which function gave each).

Nothing is dropped quietly: a function that cannot be imported, raises, returns anything other
than a mapping of names to finite numbers, or names a figure another function or the evaluation
itself reports (``trainer.contract.BUILTIN_METRICS``, ``EVAL_REPORT_KEYS``) fails the
evaluation with its name and what went wrong. The functions are loaded before any model is
scored, so a typo costs seconds. A ``causal_lm`` evaluation predicts nothing per record, so it
refuses ``eval.metrics``.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from trainer.config import USER_METRIC_EXAMPLE
from trainer.config.functions import import_function
from trainer.contract import metric_name_problem
from trainer.evaluate.scores import slice_groups


class UserMetricError(ValueError):
    """A user metric failed or gave something that is not a named number; names the function."""


@dataclass(frozen=True)
class UserMetric:
    spec: str  # module:function, as eval.metrics lists it
    function: Callable[..., Any]


@dataclass(frozen=True)
class Predictions:
    """What user metrics are given: one entry per scored eval record, in the same order."""

    predictions: list[Any]
    references: list[Any]
    records: list[dict[str, Any]]

    def subset(self, indices: Sequence[int]) -> Predictions:
        return Predictions(
            [self.predictions[i] for i in indices],
            [self.references[i] for i in indices],
            [self.records[i] for i in indices],
        )


def load_user_metrics(specs: Sequence[str]) -> list[UserMetric]:
    """Import each ``eval.metrics`` function; an ImportError or AttributeError names the one at fault."""
    return [UserMetric(spec, import_function("eval.metrics", spec, USER_METRIC_EXAMPLE)) for spec in specs]


def score(metrics: Sequence[UserMetric], given: Predictions, where: str = "") -> dict[str, tuple[float, str]]:
    """``{name: (value, spec)}``: every figure the functions return over ``given``.

    :param where: what ``given`` is, for messages (``"slice length=short"``; "" for every
        record). On a slice a function may return None or ``{}``: no figure there (a slice of
        one class, say); over every record it must return figures."""
    out: dict[str, tuple[float, str]] = {}
    on = f" on {where}" if where else ""
    for metric in metrics:
        try:
            result = metric.function(given.predictions, given.references, given.records)
        except Exception as exc:
            raise UserMetricError(
                f"user metric {metric.spec} raised {type(exc).__name__}: {exc}{on} "
                f"({len(given.predictions)} records); fix it or drop it from eval.metrics"
            ) from exc
        if where and (result is None or result == {}):
            continue  # nothing to say about this slice
        if not isinstance(result, Mapping) or not result:
            raise UserMetricError(
                f"user metric {metric.spec} returned {_shown(result)}{on}; it must return a "
                "non-empty mapping of names to numbers, e.g. {'worst_label_recall': 0.8}"
            )
        for name, value in result.items():
            figure = _check_figure(metric.spec, name, value, on)
            if name in out:
                raise UserMetricError(
                    f"user metrics {out[name][1]} and {metric.spec} both return {name!r}; "
                    "give each figure one name"
                )
            out[name] = (figure, metric.spec)
    return out


def _check_figure(spec: str, name: object, value: object, on: str) -> float:
    """``value`` as a float, or a UserMetricError naming the scorer, the figure and the fault."""
    problem = metric_name_problem(name)
    if problem:
        raise UserMetricError(
            f"user metric {spec} returned a figure named {name!r}{on}; {problem}: rename it"
        )
    try:
        figure = float(value) if isinstance(value, numbers.Real) and not isinstance(value, bool) else math.nan
    except (OverflowError, ValueError):
        figure = math.nan
    if not math.isfinite(figure):
        raise UserMetricError(
            f"user metric {spec} returned {name!r} = {_shown(value)}{on}; a figure must be a "
            "finite number (int or float)"
        )
    return figure


def _shown(value: object) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:120]}{'...' if len(text) > 120 else ''}"


def figures(
    metrics: Sequence[UserMetric], given: Predictions, columns: Sequence[str]
) -> tuple[dict[str, float], dict[str, dict[str, dict[str, float]]], dict[str, str]]:
    """The user metrics over every record and per slice: ``(overall {name: value}, per slice
    {column: {value: {name: value}}}, sources {name: spec})``. A slice value is a record's
    column as text (``str``), as the built-in slices group them; a record the eval index does
    not hold (``{}``) counts overall only."""
    overall = score(metrics, given)
    per_slice = {
        column: {
            value: {
                name: figure
                for name, (figure, _) in score(
                    metrics, given.subset(indices), f"slice {column}={value}"
                ).items()
            }
            for value, indices in values.items()
        }
        for column, values in slice_groups(given.records, columns).items()
    }
    return (
        {name: value for name, (value, _) in overall.items()},
        per_slice,
        {name: spec for name, (_, spec) in overall.items()},
    )
