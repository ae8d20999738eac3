"""The spot notice watcher: one light thread per node that polls the cloud's metadata endpoint.

SIGTERM reaches a pod late, or never when nothing drains the node; the cloud announces the
interruption earlier (``trainer.runtime.notice_sources``). On each node the local rank 0 runs
a :class:`NoticeWatcher`; what it reads goes to the rank's :class:`~trainer.runtime.preemption.StopFlag`
(an interruption stops the gang after the next step with its coordinated emergency checkpoint,
an advisory asks for a checkpoint now), and the per-step vote spreads it to every rank.

Settings, from the launcher's environment (the Kubernetes launcher sets ``auto`` for spot
capacity; unset means ``off``):

- ``TRAINOPS_SPOT_NOTICE``: ``off``, ``auto`` (ask each provider's endpoint once at start, and
  watch the one that answers), ``aws``, ``gce`` or ``azure``;
- ``TRAINOPS_METADATA_URL``: the endpoint's base URL (tests run a fake server on 127.0.0.1);
- ``TRAINOPS_SPOT_NOTICE_EVERY_S``: seconds between polls (2 by default: GCE's notice is 30 s).

A watcher never stops training on its own errors: a failed read is logged once until a read
works again, and the SIGTERM path stays as it was.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace

from trainer.contract import ENV_METADATA_URL, ENV_NODE_NAME, ENV_SPOT_NOTICE, SpotNotice
from trainer.runtime.notice_sources import (
    PROVIDERS,
    Fetch,
    MetadataError,
    Notice,
    Source,
    http_fetch,
    source_for,
)

log = logging.getLogger("trainer.notice")

ENV_EVERY_S = "TRAINOPS_SPOT_NOTICE_EVERY_S"
MODES = ("off", "auto", *PROVIDERS)
EVERY_S = 2.0


def settings_from(environ: Mapping[str, str]) -> tuple[str, str | None, float]:
    """``(mode, base_url, every_s)`` from the environment.

    :raises ValueError: a value is not one this module knows, naming it and what to set.
    """
    mode = environ.get(ENV_SPOT_NOTICE, "").strip().lower() or "off"
    if mode not in MODES:
        raise ValueError(f"{ENV_SPOT_NOTICE}={mode!r} is not one of {', '.join(MODES)}; unset it for off")
    base = environ.get(ENV_METADATA_URL, "").strip() or None
    if base is not None and not base.startswith(("http://", "https://")):
        raise ValueError(f"{ENV_METADATA_URL}={base!r} is not an http:// or https:// URL")
    raw = environ.get(ENV_EVERY_S, "").strip()
    try:
        every = float(raw) if raw else EVERY_S
    except ValueError:
        every = float("nan")
    if not 0 < every < float("inf"):
        raise ValueError(f"{ENV_EVERY_S}={raw!r} is not a number of seconds > 0; unset it for {EVERY_S:g} s")
    return mode, base, every


def detect(base_url: str | None, fetch: Fetch = http_fetch) -> Source | None:
    """The first provider whose endpoint answers as its own (AWS, GCE, Azure), else None."""
    for provider in PROVIDERS:
        source = source_for(provider, base_url, fetch)
        try:
            source.probe()
        except MetadataError:
            continue
        return source
    return None


class NoticeWatcher:
    """Polls one provider every ``every_s`` seconds in a daemon thread; each new notice goes to
    ``on_notice`` once (a notice is known by its provider and event).

    :param mode: ``auto`` or a provider (see :func:`settings_from`).
    :param clock: epoch seconds, for the notice's time.
    """

    def __init__(
        self,
        mode: str,
        base_url: str | None,
        every_s: float,
        on_notice: Callable[[Notice], None],
        *,
        fetch: Fetch = http_fetch,
        clock: Callable[[], float] = time.time,
        node: str | None = None,
    ):
        self.mode, self.base_url, self.every_s, self.node = mode, base_url, every_s, node
        self.on_notice, self.fetch, self.clock = on_notice, fetch, clock
        self.source: Source | None = None
        self.seen: set[tuple[str, str]] = set()
        self.polls = 0  # reads that worked (for tests and the log)
        self._stop = threading.Event()
        self._failing = False
        self._thread = threading.Thread(target=self._run, name="trainer-notice", daemon=True)

    def start(self) -> NoticeWatcher:
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        try:
            self.source = self._source()
        except Exception as exc:  # never training's problem
            log.warning("spot notice: the watcher could not start (%s); SIGTERM alone stops training", exc)
            return
        if self.source is None:
            return
        log.info("spot notice: watching %s's metadata every %g s", self.source.provider, self.every_s)
        while not self._stop.is_set():
            self.poll_once()
            self._stop.wait(self.every_s)

    def _source(self) -> Source | None:
        if self.mode != "auto":
            return source_for(self.mode, self.base_url, self.fetch)
        found = detect(self.base_url, self.fetch)
        if found is None:
            log.info(
                "spot notice: no metadata endpoint answered (%s); SIGTERM alone stops training",
                ", ".join(PROVIDERS),
            )
        return found

    def poll_once(self) -> list[Notice]:
        """Read the endpoint once; hand each new notice on. Never raises."""
        assert self.source is not None
        try:
            notices = self.source.poll(self.clock())
        except Exception as exc:
            if not self._failing:
                self._failing = True
                log.warning(
                    "spot notice: %s's metadata could not be read (%s); retrying", self.source.provider, exc
                )
            return []
        self.polls += 1
        if self._failing:
            self._failing = False
            log.info("spot notice: %s's metadata answers again", self.source.provider)
        new = [replace(n, node=self.node) for n in notices if (n.provider, n.event) not in self.seen]
        for notice in new:
            self.seen.add((notice.provider, notice.event))
            log.warning("spot notice: %s (%s)", notice.describe(), notice.kind)
            try:
                self.on_notice(notice)
            except Exception as exc:
                log.warning("spot notice: acting on %s failed: %s", notice.describe(), exc)
        return new


def watch(
    environ: Mapping[str, str], local_rank: int, on_notice: Callable[[Notice], None]
) -> NoticeWatcher | None:
    """Start this node's watcher (on its local rank 0; the settings are checked on every rank,
    so a bad value fails the attempt before training). None where none runs.

    :raises ValueError: a bad setting (:func:`settings_from`).
    """
    mode, base, every = settings_from(environ)
    if mode == "off" or local_rank != 0:
        return None
    return NoticeWatcher(mode, base, every, on_notice, node=environ.get(ENV_NODE_NAME) or None).start()


def notice_record(notice: Notice, *, saved_at: float, nodes: list[str] | None = None) -> SpotNotice:
    """The attempt record's ``notice``: ``notice`` (the earliest any node read), the emergency
    save that committed at ``saved_at`` (epoch seconds), and ``nodes``, every Node whose
    watcher read one (``notice.node`` alone when not given)."""
    return {
        "provider": notice.provider,
        "event": notice.event,
        "noticed_at": notice.noticed_at,
        "deadline": notice.deadline,
        "lead_s": notice.lead_s,
        "saved_at": round(saved_at, 3),
        "saved_after_s": round(saved_at - notice.noticed_at, 3),
        "node": notice.node,
        "nodes": nodes if nodes is not None else [n for n in (notice.node,) if n],
    }
