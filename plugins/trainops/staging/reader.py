"""Find a source's objects and read them as bounded-size pyarrow record batches.

``source_uri`` is one object (``.parquet``, ``.jsonl``, ``.csv``) or a prefix holding
such objects (recursively; names starting with ``_`` or ``.``, such as ``_SUCCESS``,
are skipped). ``file://`` objects are read in place; ``s3://`` objects are downloaded
to a scratch folder first. Parquet is streamed in row batches; JSONL and CSV files are
read whole, one file at a time, then cut into batches.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from trainops.staging.errors import SourceNotFound, StagingError

FORMATS = {".parquet": "parquet", ".pq": "parquet", ".jsonl": "jsonl", ".ndjson": "jsonl",
           ".csv": "csv"}
DEFAULT_BATCH_ROWS = 65536


@dataclass(frozen=True)
class SourceObject:
    uri: str
    size: int
    etag: str | None
    mtime: float | None
    format: str

    def identity(self) -> dict:
        """What says "same bytes": the etag when the store has one, else the mtime."""
        ident = {"uri": self.uri, "size": self.size}
        if self.etag:
            ident["etag"] = self.etag
        else:
            ident["mtime"] = self.mtime
        return ident


def format_of(uri: str) -> str | None:
    return FORMATS.get(os.path.splitext(uri.rstrip("/"))[1].lower())


def list_source_objects(storage, source_uri: str) -> list[SourceObject]:
    """The objects ``source_uri`` names, sorted by URI; raises SourceNotFound if none."""
    source_uri = source_uri.rstrip("/")
    fmt = format_of(source_uri)
    head = storage.head(source_uri)
    if head is not None:
        if fmt is None:
            raise StagingError(
                f"source_uri {source_uri!r} is an object of unsupported format: "
                f"point it at a {'/'.join(sorted(FORMATS))} object or a folder of them"
            )
        return [_object(source_uri, head, fmt)]
    found = [u for u in storage.list(source_uri) if not _hidden(u, source_uri)]
    objects = [u for u in found if format_of(u)]
    if not objects:
        if found:
            raise StagingError(
                f"source_uri {source_uri!r} holds {len(found)} objects but none ends in "
                f"{', '.join(sorted(FORMATS))} (first: {found[0]!r}): point it at your data files"
            )
        raise SourceNotFound(
            f"source_uri {source_uri!r} does not exist: point it at a Parquet/JSONL/CSV object "
            "or a folder of them"
        )
    out = []
    for uri in objects:
        meta = storage.head(uri)
        if meta is None:
            raise SourceNotFound(f"source object {uri!r} vanished while listing {source_uri!r}")
        out.append(_object(uri, meta, format_of(uri)))
    return out


def _object(uri: str, head: dict, fmt: str) -> SourceObject:
    return SourceObject(uri=uri, size=int(head["size"]), etag=head.get("etag") or None,
                        mtime=head.get("mtime"), format=fmt)


def _hidden(uri: str, prefix: str) -> bool:
    rel = uri[len(prefix):].lstrip("/")
    return any(part.startswith(("_", ".")) for part in rel.split("/"))


def local_paths(storage, objects: Sequence[SourceObject], scratch_dir: str) -> list[str]:
    """A local path per object: the file itself for ``file://``, a download for others."""
    paths = []
    for n, obj in enumerate(objects):
        if obj.uri.startswith("file://"):
            paths.append(os.path.normpath(obj.uri[len("file://"):]))
        else:
            path = os.path.join(scratch_dir, f"source-{n:05d}{os.path.splitext(obj.uri)[1]}")
            storage.download_file(obj.uri, path)
            paths.append(path)
    return paths


def column_names(path: str, fmt: str) -> list[str]:
    """The columns of one local source file (reads only the schema where the format allows)."""
    if fmt == "parquet":
        import pyarrow.parquet as pq

        return list(pq.read_schema(path).names)
    for batch in iter_file_batches(path, fmt, batch_rows=16):
        return list(batch.schema.names)
    return []


def iter_batches(objects: Sequence[SourceObject], paths: Sequence[str], *,
                 batch_rows: int = DEFAULT_BATCH_ROWS,
                 columns: Sequence[str] | None = None) -> Iterator:
    """Record batches of at most ``batch_rows`` rows over all objects, in order."""
    for obj, path in zip(objects, paths, strict=True):
        yield from iter_file_batches(path, obj.format, batch_rows=batch_rows, columns=columns)


def iter_file_batches(path: str, fmt: str, *, batch_rows: int = DEFAULT_BATCH_ROWS,
                      columns: Sequence[str] | None = None) -> Iterator:
    if fmt == "parquet":
        import pyarrow.parquet as pq

        with pq.ParquetFile(path) as f:
            yield from f.iter_batches(batch_size=batch_rows,
                                      columns=list(columns) if columns else None)
        return
    if fmt == "jsonl":
        import pyarrow.json as pj

        table = pj.read_json(path)
    elif fmt == "csv":
        import pyarrow.csv as pc

        table = pc.read_csv(path)
    else:
        raise StagingError(f"cannot read format {fmt!r} of {path!r}: use parquet, jsonl or csv")
    if columns:
        table = table.select(list(columns))
    yield from table.to_batches(max_chunksize=batch_rows)
