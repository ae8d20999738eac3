"""RollbackModelOperator: point production back at an earlier version."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseOperator, Context
from airflow.sdk.exceptions import AirflowFailException

from trainer.contract import model_version_prefix
from trainops.hooks.storage import root_and_storage
from trainops.operators.fail_fast import fail_fast
from trainops.operators.params import known_at_run_time, name_param
from trainops.operators.production_asset import announce, production_alias
from trainops.registry.promotion import PromotionError
from trainops.registry.rollback import rollback


class RollbackModelOperator(BaseOperator):
    """Move ``models/<name>/production.json`` back to ``version``, with who and why.

    The same compare-and-swap as a promotion moves the pointer, and the move joins its
    history (``action: rollback``, ``from_version``, ``by``, ``reason``, ``via``: this
    task). The target must have been production before; rolling back to the version that
    already is production changes nothing. If production moves while the rollback is
    written, the task fails without retrying and nothing is changed (see
    :mod:`trainops.registry.rollback`). ``python -m trainops rollback`` does the same from a shell.
    The result is what happened: a write whose reply was lost is reported as the change it
    made, and a retry of this task after its rollback took effect says so.

    A rollback that moved production emits an event on the Asset ``trainops://models/<name>``,
    as a promotion does (:mod:`trainops.operators.production_asset`).

    XCom result: ``{"model", "version", "previous_version", "changed", "by", "reason",
    "at", "production_uri", "production_version"}``, and ``since`` (the history entry that
    made ``version`` production) when ``changed`` is False.

    :param model_name: the model, e.g. ``demo-lm`` (templated; checked as a name at DAG parse,
        or once rendered, before the pointer is read).
    :param version: the version to return to, an integer or its text (templated, so a DAG
        param can choose it).
    :param reason: why, kept in the pointer's history (templated; required).
    :param by: who asks for it (templated); default: the user who triggered the DAG run,
        else ``airflow``.
    :param storage_root: storage root URI (``file://`` or ``s3://``); defaults to the
        configured root.
    :param aws_conn_id: Airflow AWS connection used for ``s3://`` storage.
    """

    template_fields: Sequence[str] = ("model_name", "version", "reason", "by")
    ui_color = "#f8d7da"

    def __init__(
        self,
        *,
        model_name: str,
        version: int | str,
        reason: str,
        by: str | None = None,
        storage_root: str | None = None,
        aws_conn_id: str | None = "aws_default",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if not known_at_run_time(model_name):
            name_param("model_name", model_name)  # else when the task runs, once rendered
        self.outlets = [*self.outlets, production_alias()]  # trainops://models/<name>, on a move
        if not isinstance(reason, str) or not reason.strip():
            raise ValueError(
                "RollbackModelOperator needs a non-empty reason; it is kept in the "
                "production pointer's history"
            )
        self.model_name = model_name
        self.version = version
        self.reason = reason
        self.by = by
        self.storage_root = storage_root
        self.aws_conn_id = aws_conn_id

    @fail_fast
    def execute(self, context: Context) -> dict:
        name_param("model_name", self.model_name)
        version = _version(self.version)
        dag_run = context.get("dag_run")
        by = self.by or getattr(dag_run, "triggering_user_name", None) or "airflow"
        ti = context.get("ti")
        via = f"{ti.dag_id}/{ti.run_id}/{ti.task_id}" if ti is not None else None
        root, storage = root_and_storage(self.storage_root, self.aws_conn_id)
        try:
            result = rollback(storage, root, self.model_name, version, reason=self.reason, by=by, via=via)
        except PromotionError as exc:
            # Every one of these needs a person: a wrong version, or production moved.
            raise AirflowFailException(str(exc)) from exc
        if result["changed"]:
            self.log.info(
                "rolled %s back from v%s to v%d (by %s: %s)",
                self.model_name,
                result["previous_version"],
                version,
                by,
                self.reason,
            )
            uri = model_version_prefix(root, self.model_name, version)
            announce(context, "rollback", self.model_name, version, uri, result["previous_version"], by)
            if result["production_version"] != version:
                self.log.info(
                    "production of %s has since moved on to v%s",
                    self.model_name,
                    result["production_version"],
                )
        else:
            self.log.info(
                "%s v%d already is production%s; nothing changed",
                self.model_name,
                version,
                _since(result.get("since"), via),
            )
        return result


def _since(entry: dict | None, via: str | None) -> str:
    """When and how the version became production, from its history entry."""
    if not entry:
        return ""
    how = entry.get("action", "move")
    if entry.get("from_version") is not None:
        how += f" from v{entry['from_version']}"
    if entry.get("by"):
        how += f" by {entry['by']}"
    if via is not None and entry.get("via") == via:
        how += ", this task's own earlier try"
    return f" (since {entry.get('at')}, {how})"


def _version(value: Any) -> int:
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise AirflowFailException(f"version must be a positive integer such as 2, got {value!r}")
    return value
