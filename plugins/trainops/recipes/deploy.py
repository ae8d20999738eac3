"""What a deploy DAG does with an event on a model's production Asset (``dags/deploy_on_promotion.py``).

Each event's extra (:func:`trainops.operators.production_asset.production_extra`) names the
model and the version a promotion or a rollback made production. The example deploys what the
model's production pointer names now (the source of truth: a later move may have come since),
checks that its folder holds a promoted version (``card.json``), and records what it would
serve in ``models/<name>/deployment.json``; a team puts its serving platform's call there (a
SageMaker endpoint update, a KServe InferenceService patch, a copy to its model store).

Imported when DAG files are parsed: nothing heavy at module level.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from trainer.contract import join, model_prefix
from trainops.registry.pointer import read_production

EXTRA_KEYS = ("action", "model", "version", "uri")


class DeployError(ValueError):
    """An event that does not name a promoted version; the message says which and why."""


def releases(events: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The newest production move per model among events' extras, in the order first met (pure).

    Several events may reach one run (two promotions while the deploy DAG was paused): only the
    last of each model is what production is now."""
    newest: dict[str, dict[str, Any]] = {}
    for extra in events:
        missing = [k for k in EXTRA_KEYS if k not in extra]
        if missing:
            raise DeployError(
                f"an event on a model's production Asset lacks {missing} (it has {sorted(extra)}): "
                "emit it with PromoteModelOperator or RollbackModelOperator"
            )
        newest[str(extra["model"])] = dict(extra)
    return list(newest.values())


def record_release(store: Any, root: str, release: Mapping[str, Any]) -> dict[str, Any]:
    """Deploy what production of ``release``'s model is now: the pointer decides, the event only
    triggers (a later move, or a rollback from the command line, which emits no event, may have
    moved it since). Checks that the version folder holds a promoted version (``card.json``),
    writes ``deployments/<model>.json`` and returns the record."""
    model = str(release["model"])
    pointer = read_production(store, root, model)
    if pointer is None:
        raise DeployError(
            f"{model} has no production version under {root}, though an event announced v{release['version']}"
        )
    version, uri = int(pointer["version"]), str(pointer["uri"])
    if store.head(join(uri, "card.json")) is None:
        raise DeployError(f"{model} v{version}: {uri} holds no card.json, so no promoted version")
    record = {
        "model": model,
        "version": version,
        "uri": uri,
        "event": dict(release),  # what triggered it; its version may be older than production now
        "deployed_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    store.put_json(join(model_prefix(root, model), "deployment.json"), record)
    return record
