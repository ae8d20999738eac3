"""The trainer's own account of an attempt (``attempts/<n>.json``, see trainer.contract)."""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import re
from dataclasses import dataclass

from trainer.contract import ENV_ATTEMPT, AttemptRecord, RunLayout, attempt_record
from trainer.storage import PreconditionFailed, Storage

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


class NonFiniteLoss(RuntimeError):
    """The mean loss of a step is NaN or infinite: training cannot go on from these weights."""

    def __init__(self, step: int, loss: float):
        super().__init__(f"loss is {loss} at step {step}")
        self.step, self.loss = step, loss


OOM_HINT = (
    "reduce train.micro_batch_size (keep train.global_batch_size) or set train.activation_checkpointing=full"
)
NON_FINITE_HINT = (
    "lower train.lr (e.g. halve it) or scale it linearly with the global batch (linear scaling rule)"
)
NETWORK_HINT = (
    "check the network and firewall between nodes (rendezvous port and NCCL/gloo ports), "
    "and NCCL_SOCKET_IFNAME"
)

# torch.distributed's error types, matched by name: this module must not import torch.
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


def classify_failure(exc: BaseException) -> tuple[str, str | None]:
    """``(kind, hint)`` for a failed attempt: kind is out_of_memory, non_finite_loss, network or error.

    The hint says what the user should try; None when we do not recognise the failure.
    """
    names = {cls.__name__ for cls in type(exc).__mro__}
    text = f"{type(exc).__name__}: {exc}".lower()
    if isinstance(exc, NonFiniteLoss):
        return "non_finite_loss", f"loss became {exc.loss} at step {exc.step}: {NON_FINITE_HINT}"
    if (
        isinstance(exc, MemoryError)
        or "OutOfMemoryError" in names
        or "out of memory" in text
        or "can't allocate memory" in text
    ):  # the last: PyTorch's CPU allocator
        return "out_of_memory", f"out of memory: {OOM_HINT}"
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

    def committed(self, step: int) -> None:
        """A checkpoint of ``step`` was committed (the checkpointer's ``on_commit``)."""
        self.checkpoint_step = step

    def write(
        self,
        outcome: str,
        *,
        signal: str | None = None,
        hint: str | None = None,
        error: str | None = None,
        exclusive: bool = False,
    ) -> AttemptRecord:
        """Write ``attempts/<n>.json`` with ``outcome`` and what the attempt got to; the record."""
        record = attempt_record(
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
        )
        # exclusive: several failing ranks may race to report; the first one wins.
        with contextlib.suppress(PreconditionFailed):
            self.storage.put_json(self.layout.attempt(self.number), record, if_none_match=exclusive)
        return record
