"""What each rank reads of a checkpoint it resumes from, so that a node fetches each byte once.

A rank's DCP load plan (``DefaultLoadPlanner`` over its own state dict and the checkpoint's
``.metadata``) names the byte ranges it reads, each in one ``__<r>_<i>.distcp`` file
(:func:`needed_ranges`). With the mesh it was saved on, a rank reads its own writer's file,
plus the small items DCP stored once for all ranks (the optimizer's step counters and
``param_groups``), which DCP's save spreads over every rank's file. Fetching every file a plan
touches would then fetch nearly every file on every node, so :func:`assign_reads` decides, the
same on every rank:

- a rank that reads more than ``relay_max_bytes`` of a file fetches it whole, into the node
  cache (``trainer.checkpoint.node_cache``: once per node, verified against the sha256 in ``_COMMITTED``,
  which covers whole files only: a byte range could not be checked against it);
- when no rank reads that much of a file, the lowest rank that reads any of it fetches it;
- every other rank that reads part of it gets its ranges from the lowest fetching rank
  (``source``), which reads them from its verified copy and sends them over the checkpoint's
  process group: :class:`RelayedFile` serves them to DCP's reader, and a read outside them fails.

A reshard (another world size or mesh) still works: a rank then reads parts of several files,
and a node fetches each file that one of its ranks reads more than ``relay_max_bytes`` of.
"""

from __future__ import annotations

import bisect
import io
import os
from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import FileSystem

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer
    from torch.distributed.checkpoint.metadata import Metadata

# A rank that reads at most this much of a file gets those bytes from another rank rather than
# fetching the file: the items DCP stores once for all ranks are a few KiB each.
RELAY_MAX_BYTES = 1024 * 1024

Range = tuple[int, int]  # (offset, length) in a file


def needed_ranges(
    state_dict: dict[str, Any], metadata: Metadata, is_coordinator: bool
) -> dict[str, tuple[Range, ...]]:
    """The byte ranges of each checkpoint file that loading ``state_dict`` reads, by file name.

    The same plan ``dcp.load`` makes with its default planner: what is listed here is what it
    opens. Raises as DCP would when the checkpoint lacks a key of ``state_dict``.
    """
    planner = DefaultLoadPlanner()
    planner.set_up_planner(state_dict, metadata, is_coordinator)
    found: dict[str, set[Range]] = {}
    for item in planner.create_local_plan().items:
        info = metadata.storage_data[item.storage_index]
        found.setdefault(info.relative_path, set()).add((int(info.offset), int(info.length)))
    return {name: tuple(sorted(ranges)) for name, ranges in sorted(found.items())}


@dataclass(frozen=True)
class ReadAssignment:
    """Who fetches each file, and who sends the bytes of the ranks that do not.

    :param fetchers: for each file some rank reads, the ranks that fetch it whole (ascending).
    :param source: for each file, the rank that sends its ranges to the others that read it.
    """

    fetchers: Mapping[str, tuple[int, ...]]
    source: Mapping[str, int]

    def fetched_by(self, rank: int) -> list[str]:
        return [name for name, ranks in self.fetchers.items() if rank in ranks]

    def relayed_to(
        self, rank: int, needs: Sequence[Mapping[str, Sequence[Range]]]
    ) -> dict[str, tuple[Range, ...]]:
        """The ranges of ``rank``'s plan that another rank sends it, by file."""
        return {
            name: tuple(ranges)
            for name, ranges in needs[rank].items()
            if ranges and rank not in self.fetchers[name]
        }

    def to_send(
        self, rank: int, needs: Sequence[Mapping[str, Sequence[Range]]]
    ) -> dict[str, tuple[Range, ...]]:
        """The ranges ``rank`` sends, by file: every range another rank has relayed."""
        out: dict[str, set[Range]] = {}
        for other in range(len(needs)):
            for name, ranges in self.relayed_to(other, needs).items():
                if self.source[name] == rank:
                    out.setdefault(name, set()).update(ranges)
        return {name: tuple(sorted(ranges)) for name, ranges in sorted(out.items())}


def assign_reads(
    needs: Sequence[Mapping[str, Sequence[Range]]],
    relay_max_bytes: int = RELAY_MAX_BYTES,
    held: Sequence[Collection[str]] | None = None,
) -> ReadAssignment:
    """Who fetches which file (see the module's docstring). Pure.

    :param needs: for every rank, in rank order, the ranges its plan reads by file
        (:func:`needed_ranges`).
    :param held: for every rank, the files its node holds already (the node-local tier,
        ``trainer.checkpoint.local_tier``): a file only small reads need is read by the first
        rank whose node holds it, rather than fetched from storage by the first reader.
    """
    readers: dict[str, list[int]] = {}
    for rank, wanted in enumerate(needs):
        for name, ranges in wanted.items():
            if ranges:
                readers.setdefault(name, []).append(rank)
    fetchers: dict[str, tuple[int, ...]] = {}
    for name, ranks in sorted(readers.items()):
        big = tuple(r for r in ranks if sum(length for _, length in needs[r][name]) > relay_max_bytes)
        local = [r for r in ranks if held is not None and name in held[r]]
        fetchers[name] = big or (min(local or ranks),)
    return ReadAssignment(fetchers, {name: ranks[0] for name, ranks in fetchers.items()})


def read_ranges(path: Path, ranges: Sequence[Range]) -> dict[Range, bytes]:
    """The bytes of each range of the local file ``path``."""
    out: dict[Range, bytes] = {}
    with open(path, "rb") as f:
        for offset, length in ranges:
            f.seek(offset)
            data = f.read(length)
            if len(data) != length:
                raise OSError(f"{path} ends before byte {offset + length}: it is not the file DCP wrote")
            out[(offset, length)] = data
    return out


class RelayedFile(io.RawIOBase):
    """A read-only file of which only some byte ranges are known: those another rank sent.

    A read that starts outside them raises, so a plan that needed more than was relayed fails
    loudly instead of reading wrong bytes.
    """

    def __init__(self, name: str, ranges: Mapping[Range, bytes]):
        super().__init__()
        self.name_ = name
        self._starts = sorted(offset for offset, _ in ranges)
        self._data = {offset: data for (offset, _), data in ranges.items()}
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        if whence == os.SEEK_SET:
            self._pos = offset
        elif whence == os.SEEK_CUR:
            self._pos += offset
        else:
            raise OSError(f"relayed checkpoint file {self.name_} has no known end to seek from")
        return self._pos

    def readinto(self, b: WriteableBuffer) -> int:
        view = memoryview(b).cast("B")
        if not len(view):
            return 0
        i = bisect.bisect_right(self._starts, self._pos) - 1
        start = self._starts[i] if i >= 0 else None
        data = self._data[start] if start is not None else b""
        if start is None or self._pos >= start + len(data):
            raise OSError(
                f"byte {self._pos} of checkpoint file {self.name_} was not relayed to this rank: its "
                "load plan reads more than the plan it announced"
            )
        chunk = data[self._pos - start : self._pos - start + len(view)]
        view[: len(chunk)] = chunk
        self._pos += len(chunk)
        return len(chunk)


class NodeFileSystem(FileSystem):
    """DCP's local filesystem over the node's folder, with relayed files served from memory."""

    def __init__(self, relayed: Mapping[str, Mapping[Range, bytes]]):
        super().__init__()
        self.relayed = relayed

    @contextmanager
    def create_stream(self, path: str | os.PathLike, mode: str) -> Iterator[io.IOBase]:
        name = os.path.basename(path)
        if name in self.relayed and mode == "rb":
            with RelayedFile(name, self.relayed[name]) as stream:
                yield stream
            return
        with super().create_stream(path, mode) as stream:
            yield stream
