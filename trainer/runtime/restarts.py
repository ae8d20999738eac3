"""In-place restarts: what a worker that torchrun restarted does with what the one before it left.

With ``--max-restarts=K`` (``trainer.contract.torchrun_argv``'s ``restarts_in_place``) a
node's torchrun agent restarts its workers in the same pod when one of them failed: a killed
worker, an exception, a peer gone. The gang re-forms under the same attempt number
(``$TRAINOPS_ATTEMPT``) with ``$TORCHELASTIC_RESTART_COUNT`` one higher, and resumes from
the newest committed checkpoint, from the node-local tier where the node holds it
(``trainer.checkpoint.save``). torchrun restarts whatever the exit code was, so before it
builds anything the new incarnation reads the attempt's record (``attempts/<n>.json``):

- ``preempted``: the gang had agreed to stop and saved (a spot notice, a SIGTERM that reached
  the workers but not the agent): it exits at once with the preempted code, so that torchrun
  spends its restarts in seconds and the operator relaunches elsewhere;
- ``completed``: nothing is left to do: it exits 0;
- ``failed`` with cause ``program`` (a bad config, a loss no rollback cures, out of memory):
  a restart would fail the same way: it exits 1 at once, and the record stays as it is;
- otherwise (a peer gone, a network or storage blip, no record at all: the killed worker wrote
  none, and its peers had no time to) it trains, carrying the earlier incarnations in its
  record's ``restarts``, so that the record shows both levels of recovery.

The decisions are plain functions; :func:`read_earlier` is the one read.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from trainer.contract import ENV_ATTEMPT, ENV_MAX_RESTARTS, ENV_RESTART_COUNT, RunLayout
from trainer.runtime.preemption import PREEMPTED_EXIT_CODE
from trainer.storage import NotFound, Storage, StorageError, StorageUnavailable

log = logging.getLogger("trainer.restarts")

# What each incarnation keeps of the one before it (the rest is the newest record's).
CARRIED = (
    "outcome",
    "cause",
    "error",
    "last_step",
    "checkpoint_step",
    "steps_lost",
    "resumed_from_step",  # where it began: what the one before it kept, when that one left no record
    "started_at",
    "ended_at",
    "first_step_time",
    "restore_s",
)
PROGRAM_EXIT_CODE = 1


def restart_count(environ: Mapping[str, str]) -> int:
    """This incarnation's number: 0 for the first, K after torchrun restarted the workers K
    times (``$TORCHELASTIC_RESTART_COUNT``; unset or not a number: 0)."""
    try:
        return max(0, int(environ.get(ENV_RESTART_COUNT, "0")))
    except ValueError:
        return 0


@dataclass(frozen=True)
class Earlier:
    """What a restarted incarnation learnt from the attempt's record.

    :param restarts: the earlier incarnations, oldest first (the attempt record's ``restarts``).
    :param exit_code: the code to exit with at once, without training (None: train).
    :param why: what the log says about it.
    """

    restarts: list[dict[str, Any]] = field(default_factory=list)
    exit_code: int | None = None
    why: str = ""


def summary(record: Mapping[str, Any] | None, restart: int) -> dict[str, Any]:
    """The ``restarts`` entry of incarnation ``restart``, from the record it left (None: none)."""
    if record is None:
        return {
            "restart": restart,
            "outcome": "unknown",
            "error": "no attempt record: its processes were killed before any rank wrote one",
        }
    return {"restart": restart, **{key: record.get(key) for key in CARRIED if key in record}}


def decide(record: Mapping[str, Any] | None, restart: int) -> Earlier:
    """What incarnation ``restart`` (≥ 1) does, given the record the one before it left."""
    earlier = record.get("restarts") if record is not None else None
    carried = [dict(e) for e in earlier if isinstance(e, dict)] if isinstance(earlier, list) else []
    # The record is that of the incarnation after its ``restarts``; an incarnation that left
    # none (killed before any rank wrote one) shows as unknown.
    restarts = [*carried, summary(record, len(carried))] if record is not None else carried
    restarts += [summary(None, n) for n in range(len(restarts), restart)]
    restarts = restarts[:restart]
    # A record older than the incarnation before this one still decides: an incarnation that
    # exits at once (below) writes nothing, and one that trained found a record that let it.
    outcome = record.get("outcome") if record is not None else None
    if outcome == "preempted":
        return Earlier(
            restarts, PREEMPTED_EXIT_CODE, "the attempt was preempted and saved: nothing to restart"
        )
    if outcome == "completed":
        return Earlier(restarts, 0, "the attempt completed: nothing to restart")
    if outcome == "failed" and record is not None and record.get("cause", "program") == "program":
        return Earlier(
            restarts,
            PROGRAM_EXIT_CODE,
            f"the attempt failed in the program ({record.get('error')}): a restart would fail the same way",
        )
    if outcome == "failed" and record is not None and record.get("cause") == "node":
        return Earlier(
            restarts,
            PROGRAM_EXIT_CODE,
            f"a node failed ({record.get('error')}): a restart in the same pods would meet it again; "
            "the operator relaunches the gang, away from that node",
        )
    return Earlier(restarts)


def read_earlier(storage: Storage, layout: RunLayout, environ: Mapping[str, str]) -> Earlier | None:
    """What this incarnation learns from the attempt's record: None for a first incarnation, or
    where no restart in place can happen (torchrun's ``--max-restarts`` 0, or no attempt number
    from the launcher).

    The restart count alone cannot tell: a node's agent that restarts its healthy workers for
    another node's sake counts nothing. So the attempt's own record, which no first incarnation
    finds (every launch has a new number), says it; and where there is none (the incarnation
    before was killed before any rank wrote one), its heartbeat says an incarnation trained. A
    record that cannot be read (storage down) counts as none: the trainer meets the outage
    itself, except an outage (``StorageUnavailable``): then it exits at once, since it would
    only meet the outage again, and each restart's failure would push the record that rank 0
    printed in place of the unwritable one out of the log tail the operator reads.
    """
    number = environ.get(ENV_ATTEMPT)
    if not number or max_restarts(environ) == 0:
        return None
    count = restart_count(environ)
    try:
        record = storage.get_json(layout.attempt(int(number)))
    except NotFound:
        record = None
    except StorageUnavailable as exc:  # an outage: a restart in place would only meet it again
        why = (
            f"storage is unreachable ({exc}): a restart in place would meet the same outage; the "
            "operator relaunches the gang after its back-off"
        )
        return Earlier([summary(None, n) for n in range(max(count, 1))], PROGRAM_EXIT_CODE, why)
    except (ValueError, OSError, StorageError) as exc:  # damaged, a bad number, a disk's error (file://)
        log.warning("could not read the attempt's record (%s); training on", exc)
        record = None
    if not isinstance(record, dict):
        record = None
    if record is None and count == 0 and not _exists(storage, layout.heartbeat(int(number))):
        return None
    carried = record.get("restarts") if record is not None else None
    before = (len(carried) if isinstance(carried, list) else 0) + (record is not None)
    return decide(record, max(count, before, 1))


def max_restarts(environ: Mapping[str, str]) -> int:
    """torchrun's ``--max-restarts`` as its workers see it (unset or not a number: 0)."""
    try:
        return max(0, int(environ.get(ENV_MAX_RESTARTS, "0")))
    except ValueError:
        return 0


def _exists(storage: Storage, uri: str) -> bool:
    try:
        return storage.head(uri) is not None
    except (ValueError, OSError, StorageError):
        return False
