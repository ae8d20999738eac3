"""Count the bytes read from files under some folders, by file name (a test helper).

It wraps every file that ``open`` / ``io.open`` / ``Path.open`` opens for reading under the
folders and counts what Python code reads through it, and counts ``os.read`` on descriptors of
files under them (found through ``/proc/self/fd``, Linux): the checksums, etags and uploads of
``trainer.storage`` and ``trainer.checkpoint.save`` read one way or the other. (Memory maps are not
seen; nothing on the paths these tests watch uses them.)
"""

from __future__ import annotations

import builtins
import io
import os
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest


class _Counted:
    def __init__(self, f: Any, tally: Counter, name: str):
        self._f, self._tally, self._name = f, tally, name

    def _count(self, data: Any) -> Any:
        self._tally[self._name] += len(data) if data else 0
        return data

    def read(self, *args: Any) -> Any:
        return self._count(self._f.read(*args))

    def read1(self, *args: Any) -> Any:
        return self._count(self._f.read1(*args))

    def readline(self, *args: Any) -> Any:
        return self._count(self._f.readline(*args))

    def readlines(self, *args: Any) -> Any:
        lines = self._f.readlines(*args)
        self._tally[self._name] += sum(len(line) for line in lines)
        return lines

    def readinto(self, buffer: Any) -> Any:
        count = self._f.readinto(buffer)
        self._tally[self._name] += count or 0
        return count

    def readinto1(self, buffer: Any) -> Any:
        count = self._f.readinto1(buffer)
        self._tally[self._name] += count or 0
        return count

    def __iter__(self) -> Any:
        for line in self._f:
            yield self._count(line)

    def __enter__(self) -> _Counted:
        self._f.__enter__()
        return self

    def __exit__(self, *exc: Any) -> Any:
        return self._f.__exit__(*exc)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._f, name)


def count_reads(monkeypatch: pytest.MonkeyPatch, roots: Iterable[Path]) -> Counter:
    """From now on (until the test ends), bytes read from files under ``roots``, by file name."""
    tally: Counter = Counter()
    watched = [os.path.realpath(root) for root in roots]
    real_open = io.open

    def counting_open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        f = real_open(file, mode, *args, **kwargs)
        if isinstance(file, (str, os.PathLike)) and ("r" in mode or "+" in mode):
            path = os.path.realpath(os.fspath(file))
            if any(path.startswith(root + os.sep) for root in watched):
                return _Counted(f, tally, os.path.basename(path))
        return f

    real_read = os.read

    def counting_read(fd: int, n: int) -> bytes:
        data = real_read(fd, n)
        try:
            path = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return data
        if any(path.startswith(root + os.sep) for root in watched):
            tally[os.path.basename(path)] += len(data)
        return data

    monkeypatch.setattr(builtins, "open", counting_open)
    monkeypatch.setattr(io, "open", counting_open)
    monkeypatch.setattr(os, "read", counting_read)
    return tally


def has_user_xattrs(folder: Path) -> bool:
    """Whether files in ``folder`` keep user extended attributes (where ``file://`` records etags)."""
    probe = folder / ".xattr-probe"
    probe.write_bytes(b"")
    try:
        os.setxattr(probe, "user.probe", b"1")
        return True
    except (OSError, AttributeError):  # AttributeError: not Linux
        return False
    finally:
        probe.unlink()
