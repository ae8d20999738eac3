"""The Airflow Asset a model's production pointer publishes: ``trainops://models/<name>``.

``PromoteModelOperator`` and ``RollbackModelOperator`` emit an event on it each time they move
production, so a deploy DAG can be scheduled on "a new production model"
(``schedule=[model_asset("retrain-lm")]``; ``dags/deploy_on_promotion.py``). The event's
extra says what production is now (:func:`production_extra`). The tasks' outlet is the alias
:data:`PRODUCTION_ALIAS`, through which each adds the event of its model's Asset: a model name
may be a template, known only when the task runs, and a task that moved nothing (a rollback to
the version in production) emits nothing.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from airflow.sdk import Asset, AssetAlias

MODEL_ASSET_SCHEME = "trainops"
PRODUCTION_ALIAS = "trainops-production"


def model_asset_uri(name: str) -> str:
    """``trainops://models/<name>``, the name percent-encoded (a model name may hold any
    printable character, ``trainer.contract.check_name``)."""
    return f"{MODEL_ASSET_SCHEME}://models/{quote(name, safe='')}"


def model_asset(name: str) -> Asset:
    """The Asset of ``name``'s production pointer (its name is its URI)."""
    uri = model_asset_uri(name)
    return Asset(name=uri, uri=uri)


def production_alias() -> AssetAlias:
    """The alias a task whose model name is a template emits its events through."""
    return AssetAlias(name=PRODUCTION_ALIAS)


def production_extra(
    *, action: str, model: str, version: int, uri: str, previous_version: int | None, by: str | None
) -> dict[str, Any]:
    """An event's extra: ``action`` (``promote`` or ``rollback``), the model, the version that
    is production now, its folder's URI, the version it replaced, and who moved it."""
    return {
        "action": action,
        "model": model,
        "version": int(version),
        "uri": uri,
        "previous_version": previous_version,
        "by": by,
    }


def emit(outlet_events: Any, model_name: str, extra: dict[str, Any]) -> None:
    """Add the event on ``model_name``'s Asset, through the alias (``context["outlet_events"]``):
    a task emits one only when it moved production (a run that changed nothing emits none)."""
    if outlet_events is None:  # called outside a task run (a test of execute, the command line)
        return
    outlet_events[production_alias()].add(model_asset(model_name), extra=extra)


def announce(
    context: Any,
    action: str,
    model: str,
    version: int,
    uri: str,
    previous_version: int | None,
    by: str | None,
) -> None:
    """A task moved ``model``'s production to ``version`` (at ``uri``): its event (:func:`emit`)."""
    extra = production_extra(
        action=action, model=model, version=version, uri=uri, previous_version=previous_version, by=by
    )
    emit(context.get("outlet_events"), model, extra)
