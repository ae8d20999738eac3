"""The model registry's errors: what promotion, re-gating and rollback raise.

Every one is a :class:`PromotionError`, so a caller that only reports catches that; each
message says what went wrong and what to do next.
"""

# No postponed annotations here: TypedDict tells required from NotRequired keys at run time
# only from evaluated annotations (``__required_keys__``).
from typing import Any, NotRequired, TypedDict

__all__ = [
    "HistoryEntry",
    "LegacyRegistry",
    "MalformedPointer",
    "Move",
    "Pointer",
    "ProductionMovedError",
    "PromotionError",
    "RegateRejected",
    "RegistryNameConflict",
    "RollbackConflict",
    "version_label",
]


# The production pointer's records: here, below ``pointer.py`` (which re-exports them), because
# ProductionMovedError carries the pointer it found.
class Move(TypedDict):
    """What a move records in the history, besides the version it moves to."""

    at: str
    action: str  # "promote" or "rollback"
    run_uri: str | None  # the run the version came from
    from_version: NotRequired[int]  # a rollback's: the version it replaced
    by: NotRequired[str]
    reason: NotRequired[str]
    via: NotRequired[str]  # a rollback's task, as dag_id/run_id/task_id


class HistoryEntry(Move):
    version: int


class Pointer(TypedDict):
    """``production.json``: the version in production and every move that led there."""

    format: str
    model: NotRequired[str]  # the model's exact name; a pointer written by hand may have none
    version: int
    uri: str  # the version's prefix, models/<name>/versions/<v>
    promoted_at: str  # when it became production (the last move's ``at``)
    run_uri: str | None
    history: list[HistoryEntry]


def version_label(version: int | None) -> str:
    """How messages name a production version: ``v3``, or ``(none)`` before the first one."""
    return f"v{version}" if version is not None else "(none)"


class PromotionError(Exception):
    """Promotion could not proceed."""


class MalformedPointer(PromotionError, ValueError):
    """A production pointer that is not JSON or not of the pointer's shape; the message names
    the file and the field (a ValueError too, for readers that only report). ``field`` (None: the
    file is not JSON), ``expected`` and ``got`` say it in parts, for readers that word it their way
    (``trainops.shapes``)."""

    def __init__(
        self, message: str, *, field: str | None = None, expected: str = "valid JSON", got: str = ""
    ) -> None:
        self.field, self.expected, self.got = field, expected, got
        super().__init__(message)


class RegistryNameConflict(PromotionError):
    """The registry folder computed for one model name holds another model's pointer or
    versions; nothing was changed. ``recorded`` is the name found, ``name`` the one asked for."""

    def __init__(self, message: str, *, name: str, recorded: str, uri: str):
        self.name, self.recorded, self.uri = name, recorded, uri
        super().__init__(message)


class LegacyRegistry(RegistryNameConflict):
    """Model ``name``'s registry is still in the folder an older trainops named it by (``uri``
    is its pointer there), not in the folder names map to now; nothing was read or changed."""


class ProductionMovedError(PromotionError):
    """The production pointer changed after the gate compared against it.

    ``pointer`` is the pointer as read (None: no production model); ``reason``, when set,
    says why the candidate could not be re-gated against it.
    """

    def __init__(
        self,
        model: str,
        expected_version: int | None,
        current_version: int | None,
        *,
        pointer: Pointer | None = None,
        reason: str | None = None,
    ):
        self.model = model
        self.expected_version = expected_version
        self.current_version = current_version
        self.pointer = pointer
        self.reason = reason
        target = f"against v{current_version}" if current_version is not None else "with no production model"
        moved = (
            f"production of {model!r} moved from {version_label(expected_version)} to "
            f"{version_label(current_version)} while this run was gated"
        )
        if reason is None:
            message = f"{moved}; re-run to evaluate {target}"
        else:
            message = (
                f"{moved}, and {reason}; the candidate must be evaluated {target}: clear "
                "this DAG run's evaluate task (it evaluates against the current "
                "production model) or trigger a new run"
            )
        super().__init__(message)


class RegateRejected(PromotionError):
    """Production moved, and the candidate fails its checks against the new production model."""

    def __init__(self, message: str, decision: dict[str, Any]):
        self.decision = decision
        super().__init__(message)


class RollbackConflict(PromotionError):
    """Production moved while the rollback was being written; nothing was changed."""
