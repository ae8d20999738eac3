"""The trainer's own account of an attempt (``attempts/<n>.json``, see trainer.contract)."""

from __future__ import annotations

import datetime as dt
import errno
import math
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass

from trainer.contract import ENV_ATTEMPT, AttemptRecord, Cause, RunLayout, SpotNotice, attempt_record
from trainer.storage import Storage, StorageError, StorageUnavailable
from trainer.storage.retry import Abandoned

_ATTEMPT_FILE = re.compile(r"/(\d+)\.json$")


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def next_attempt_number(existing_uris: list[str]) -> int:
    """One more than the highest ``attempts/<n>.json`` already written (1 for none)."""
    numbers = [int(m.group(1)) for uri in existing_uris if (m := _ATTEMPT_FILE.search(uri))]
    return max(numbers, default=0) + 1


def attempt_number(storage: Storage, layout: RunLayout) -> int:
    """``$TRAINOPS_ATTEMPT`` as set by the launcher, else the next free number."""
    value = os.environ.get(ENV_ATTEMPT)
    if value:
        try:
            number = int(value)
        except ValueError:
            number = 0
        if number < 1:
            raise ValueError(
                f"{ENV_ATTEMPT}={value!r} is not a positive integer; the launcher must set 1, 2, ..."
            )
        return number
    return next_attempt_number(storage.list(layout.attempts))


class CausedError(RuntimeError):
    """A failure that knows its cause (``storage``, ``network``, ``node`` or ``program``), for
    example one that a peer rank reported through a collective, where the original exception
    is gone."""

    def __init__(self, message: str, cause: Cause = "program"):
        super().__init__(message)
        self.cause: Cause = cause


class NonFiniteLoss(RuntimeError):
    """The mean loss of a step is NaN or infinite (or a spike), and no rollback may cure it
    (``trainer.runtime.bad_loss``): training cannot go on from these weights.

    :param detail: the message, when there is more to say (the rollbacks made before).
    """

    def __init__(self, step: int, loss: float, detail: str | None = None):
        super().__init__(detail or f"loss is {loss} at step {step}")
        self.step, self.loss = step, loss


OOM_HINT = (
    "reduce train.micro_batch_size (keep train.global_batch_size) or set train.activation_checkpointing=full"
)
NON_FINITE_HINT = (
    "lower train.lr (e.g. halve it) or scale it linearly with the global batch (linear scaling rule)"
)
STORAGE_HINT = (
    "storage refused or could not be reached even after the client's retries (an outage, "
    "throttling, a full disk): the attempt is relaunched from its last committed checkpoint "
    "(max_infra_retries); if it keeps failing, check the storage endpoint, its credentials and free space"
)
NETWORK_HINT = (
    "check the network and firewall between nodes (rendezvous port and NCCL/gloo ports), "
    "and NCCL_SOCKET_IFNAME"
)
NODE_HINT = (
    "the node has fewer working GPUs than the job was given: the attempt is relaunched "
    "(max_infra_retries), usually on another node; if it keeps failing, check the nodes' NVIDIA "
    "driver and device plugin, or set gpus_per_node=0 to train on CPUs"
)

# torch.distributed's error types, matched by name: this module must not import torch. Where
# no type says it (a collective's failure reaches us as a RuntimeError), its words do.
_DIST_ERRORS = {"DistBackendError", "DistNetworkError", "DistStoreError"}
_COLLECTIVE_WORDS = (
    "gloo",
    "nccl",
    "c10d",
    "processgroup",
    "process group",
    "collective",
    "rendezvous",
    "tcpstore",
    "watchdog",
)
_NETWORK_WORDS = (
    "connection reset",
    "connection closed",
    "connection refused",
    "broken pipe",
    "timed out",
    "timeout",
    "socket",
    "peer",
)

# A remote filesystem behind file:// that failed, rather than a bad path.
_STORAGE_ERRNOS = frozenset({errno.EIO, errno.ESTALE, errno.ETIMEDOUT})


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and the exceptions it was raised from or while handling, outermost first."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def storage_cause(error: StorageError) -> Cause:
    """Whose failure a storage error is, by its type alone.

    The storage client retries whatever a retry can cure (throttling, 5xx, resets, timeouts)
    for up to its outage tolerance and only then raises :class:`StorageUnavailable` (or, for
    the other parts of an upload that one part gave up on, ``Abandoned``): an outage, which a
    relaunch may outlast. Every other storage error is the client's final verdict (an object
    that is not there, a lost race, access denied, a missing bucket, a bad URI, a damaged
    JSON object), and a relaunch would meet it again.
    """
    return "storage" if isinstance(error, StorageUnavailable | Abandoned) else "program"


def _cause_in_chain(exc: BaseException) -> Cause | None:
    """The cause that the exception chain states or shows, or None when it shows none."""
    for error in _chain(exc):
        if isinstance(error, CausedError):
            return error.cause
        if isinstance(error, StorageError):
            return storage_cause(error)
        if isinstance(error, OSError) and error.errno in _STORAGE_ERRNOS:
            return "storage"
    return None


def classify_failure(exc: BaseException) -> tuple[str, str | None]:
    """``(kind, hint)`` for a failed attempt: kind is out_of_memory, non_finite_loss, storage,
    network, node or error.

    The hint says what the user should try; None when we do not recognise the failure.
    """
    names = {cls.__name__ for cls in type(exc).__mro__}
    text = f"{type(exc).__name__}: {exc}".lower()
    if isinstance(exc, NonFiniteLoss):
        # a finite loss here had non-finite gradients (trainer.runtime.bad_loss)
        what = (
            f"loss became {exc.loss}"
            if not math.isfinite(exc.loss)
            else (f"gradients became non-finite (loss {exc.loss:.4g})")
        )
        return "non_finite_loss", f"{what} at step {exc.step}: {NON_FINITE_HINT}"
    if (
        isinstance(exc, MemoryError)
        or "OutOfMemoryError" in names
        or "out of memory" in text
        or "can't allocate memory" in text
    ):  # the last: PyTorch's CPU allocator
        return "out_of_memory", f"out of memory: {OOM_HINT}"
    stated = _cause_in_chain(exc)
    if stated == "storage":
        return "storage", STORAGE_HINT
    if stated == "network":
        return "network", f"a collective between ranks failed or timed out: {NETWORK_HINT}"
    if stated == "node":
        return "node", NODE_HINT
    if stated == "program":
        return "error", None
    # A storage read that timed out is not a collective's: require a collective's words (or type).
    if (
        names & _DIST_ERRORS
        or "ncclremoteerror" in text
        or "ncclsystemerror" in text
        or (any(w in text for w in _COLLECTIVE_WORDS) and any(w in text for w in _NETWORK_WORDS))
    ):
        return "network", f"a collective between ranks failed or timed out: {NETWORK_HINT}"
    return "error", None


def failure_hint(exc: BaseException) -> str | None:
    """What the user should change, for failures we recognise."""
    return classify_failure(exc)[1]


def cause_of(kind: str) -> Cause:
    """The attempt record's ``cause`` for a kind of :func:`classify_failure`."""
    if kind == "storage":
        return "storage"
    if kind == "network":
        return "network"
    if kind == "node":
        return "node"
    return "program"


@dataclass
class Attempt:
    """What the record needs, filled in as the attempt goes."""

    storage: Storage
    layout: RunLayout
    number: int
    world_size: int
    started_at: str
    resumed_from_step: int | None = None
    last_step: int = 0
    checkpoint_step: int | None = None
    emergency_save_s: float | None = None  # seconds from the stop to the committed emergency save
    first_step_time: float | None = None  # epoch seconds: the attempt's first step began
    signal_time: float | None = None  # epoch seconds: the stop signal came
    restore_s: float | None = None  # seconds the resume's checkpoint load took
    notice: SpotNotice | None = None  # the cloud's notice that stopped the attempt
    rollbacks: list[dict[str, object]] | None = None  # bad-loss rollbacks (trainer.runtime.bad_loss)
    restarts: list[dict[str, object]] | None = None  # earlier incarnations (trainer.runtime.restarts)
    restore_files: dict[str, int] | None = None  # where the resume's files came from (local, storage)

    def committed(self, step: int) -> None:
        """A checkpoint of ``step`` was committed (the checkpointer's ``on_commit``)."""
        self.checkpoint_step = step

    def record(
        self,
        outcome: str,
        *,
        signal: str | None = None,
        hint: str | None = None,
        error: str | None = None,
        cause: Cause | None = None,
        metrics_unwritten: int = 0,
    ) -> AttemptRecord:
        """The record of this attempt ending now with ``outcome`` (see ``attempt_record``)."""
        return attempt_record(
            attempt=self.number,
            outcome=outcome,
            last_step=self.last_step,
            checkpoint_step=self.checkpoint_step,
            world_size=self.world_size,
            resumed_from_step=self.resumed_from_step,
            signal=signal,
            hint=hint,
            error=error,
            started_at=self.started_at,
            ended_at=now_iso(),
            cause=cause,
            metrics_unwritten=metrics_unwritten,
            emergency_save_s=self.emergency_save_s,
            first_step_time=self.first_step_time,
            signal_time=self.signal_time,
            restore_s=self.restore_s,
            notice=self.notice,
            rollbacks=self.rollbacks,
            restarts=self.restarts,
            restore_files=self.restore_files,
        )

    def store(self, record: AttemptRecord) -> None:
        """Write ``record`` to ``attempts/<n>.json`` (a failed one goes through
        ``trainer.runtime.failed_record``, since several failing ranks race to report)."""
        self.storage.put_json(self.layout.attempt(self.number), record)

    def write(
        self,
        outcome: str,
        *,
        signal: str | None = None,
        hint: str | None = None,
        error: str | None = None,
        cause: Cause | None = None,
        metrics_unwritten: int = 0,
    ) -> AttemptRecord:
        """Write ``attempts/<n>.json`` with ``outcome`` and what the attempt got to; the record."""
        record = self.record(
            outcome, signal=signal, hint=hint, error=error, cause=cause, metrics_unwritten=metrics_unwritten
        )
        self.store(record)
        return record
