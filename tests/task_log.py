"""A task log for tests of code that takes one (``log.info`` / ``log.warning``, %-style)."""

from __future__ import annotations


class RecordingLog:
    """Keeps what was said, in order, as ``(level, text)``."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str]] = []

    def info(self, msg: str, *args: object) -> None:
        self.lines.append(("info", msg % args))

    def warning(self, msg: str, *args: object) -> None:
        self.lines.append(("warning", msg % args))
