"""Find a source's objects and read them as bounded-size pyarrow record batches.

``source_uri`` is one object (``.parquet``, ``.jsonl``, ``.csv``), a prefix holding such
objects (recursively; names starting with ``_`` or ``.``, such as ``_SUCCESS``, are
skipped), or a glob (``s3://b/raw/*.parquet``, ``file:///d/**/*.jsonl``; see :mod:`globs`).
``file://`` objects are read in place; an ``s3://`` object is downloaded to a scratch
folder just before it is read and deleted after, so local disk holds one object at a time.

Every format is streamed: Parquet by record batches, JSONL and CSV by blocks of a few MiB,
so memory holds a batch, never a whole file, however large the file is.
"""

from __future__ import annotations

import codecs
import contextlib
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from trainops.staging.errors import SourceNotFound, StagingError
from trainops.staging.globs import glob_filter, split_glob

FORMATS = {".parquet": "parquet", ".pq": "parquet", ".jsonl": "jsonl", ".ndjson": "jsonl", ".csv": "csv"}
DEFAULT_BATCH_ROWS = 65536
_BLOCK_BYTES = 4 << 20  # JSONL/CSV read block; type inference looks at the first one


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
    prefix, pattern = split_glob(source_uri)
    if pattern is None:
        head = storage.head(source_uri)
        if head is not None:
            fmt = format_of(source_uri)
            if fmt is None:
                raise StagingError(
                    f"source_uri {source_uri!r} is an object of unsupported format: "
                    f"point it at a {'/'.join(sorted(FORMATS))} object or a folder of them"
                )
            return [_object(source_uri, head, fmt)]
    found = [u for u in storage.list(prefix) if not _hidden(u, prefix)]
    if pattern is not None:
        found = glob_filter(prefix, pattern, found)
    objects = {u: fmt for u in found if (fmt := format_of(u))}
    if not objects:
        if found:
            raise StagingError(
                f"source_uri {source_uri!r} holds {len(found)} objects but none ends in "
                f"{', '.join(sorted(FORMATS))} (first: {found[0]!r}): point it at your data files"
            )
        what = "matches no objects" if pattern else "does not exist or is an empty prefix"
        raise SourceNotFound(
            f"source_uri {source_uri!r} {what}: point it at a Parquet/JSONL/CSV object, a "
            "folder of them or a glob such as s3://bucket/raw/*.parquet"
        )
    out = []
    for uri in sorted(objects):
        meta = storage.head(uri)
        if meta is None:
            raise SourceNotFound(f"source object {uri!r} vanished while listing {source_uri!r}")
        out.append(_object(uri, meta, objects[uri]))
    return out


def check_not_empty_parquet(objects: Sequence[SourceObject]) -> None:
    """Refuse zero-byte Parquet objects (pure). Even a Parquet file without rows holds its
    schema and a footer, so zero bytes is a failed or unfinished write, and skipping it would
    stage less data than was delivered without a word. A zero-byte JSONL or CSV object is an
    empty file: no rows, skipped when read."""
    empty = [o.uri for o in objects if o.size == 0 and o.format == "parquet"]
    if empty:
        more = f" and {len(empty) - 3} more" if len(empty) > 3 else ""
        raise StagingError(
            f"source objects {', '.join(map(repr, empty[:3]))}{more} are empty (0 bytes), which is not a "
            "Parquet file (one without rows still holds its schema): re-export them, or remove them from the source"
        )


def _object(uri: str, head: dict, fmt: str) -> SourceObject:
    return SourceObject(
        uri=uri, size=int(head["size"]), etag=head.get("etag") or None, mtime=head.get("mtime"), format=fmt
    )


def _hidden(uri: str, prefix: str) -> bool:
    rel = uri[len(prefix) :].lstrip("/")
    return any(part.startswith(("_", ".")) for part in rel.split("/"))


@contextlib.contextmanager
def local_copy(storage, obj: SourceObject, scratch_dir: str) -> Iterator[str]:
    """A local path for ``obj``: the file itself for ``file://``, else a download deleted after."""
    if obj.uri.startswith("file://"):
        yield os.path.normpath(obj.uri[len("file://") :])
        return
    path = os.path.join(scratch_dir, f"source{os.path.splitext(obj.uri)[1]}")
    storage.download_file(obj.uri, path)
    try:
        yield path
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def read_schema(path: str, obj: SourceObject, *, string_columns: Sequence[str] = ()):
    """The Arrow schema of one local source file (Parquet: the footer; else the first block)."""
    with _read_errors(obj, path):
        if obj.format == "parquet":
            import pyarrow.parquet as pq

            return pq.read_schema(path)
        return _text_reader(path, obj.format, string_columns).schema


def iter_file_batches(
    path: str, obj: SourceObject, *, batch_rows: int = DEFAULT_BATCH_ROWS, string_columns: Sequence[str] = ()
) -> Iterator:
    """Record batches of at most ``batch_rows`` rows from one local file.

    ``string_columns`` are read as text where the format has no types (CSV), so an id
    column of digits stays the same value the JSONL or Parquet form would give.
    """
    with _read_errors(obj, path):
        for batch in _rebatch(_raw_batches(path, obj.format, batch_rows, string_columns), batch_rows):
            # Readers pass string bytes through unchecked; bad UTF-8 must stop here, named,
            # not deep inside validation or tokenization.
            batch.validate(full=True)
            yield batch


def _raw_batches(path: str, fmt: str, batch_rows: int, string_columns: Sequence[str]):
    if fmt == "parquet":
        import pyarrow.parquet as pq

        # Buffered page reads: a large row group is not loaded into memory all at once.
        with pq.ParquetFile(path, pre_buffer=False, buffer_size=1 << 20) as f:
            yield from f.iter_batches(batch_size=batch_rows)
        return
    yield from _text_reader(path, fmt, string_columns)


def _text_reader(path: str, fmt: str, string_columns: Sequence[str]):
    """A streaming reader of a JSONL or CSV file, one block at a time."""
    if fmt == "jsonl":
        import pyarrow.json as pj

        return pj.open_json(path, read_options=pj.ReadOptions(block_size=_BLOCK_BYTES))
    if fmt == "csv":
        import pyarrow as pa
        import pyarrow.csv as pcsv

        # Each block may infer its own types; text columns must stay text throughout.
        types = {c: pa.large_string() for c in string_columns}
        return pcsv.open_csv(
            path,
            read_options=pcsv.ReadOptions(block_size=_BLOCK_BYTES),
            convert_options=pcsv.ConvertOptions(column_types=types),
        )
    raise StagingError(f"cannot read format {fmt!r} of {path!r}: use parquet, jsonl or csv")


def _rebatch(batches, rows: int):
    """Cut or join batches to ``rows`` rows each (GX costs per batch, so tiny ones waste time)."""
    import pyarrow as pa

    pending, have = [], 0
    for batch in batches:
        while batch.num_rows:
            take = min(rows - have, batch.num_rows)
            pending.append(batch.slice(0, take))
            have += take
            batch = batch.slice(take)
            if have == rows:
                yield pending[0] if len(pending) == 1 else pa.concat_batches(pending)
                pending, have = [], 0
    if pending:
        yield pending[0] if len(pending) == 1 else pa.concat_batches(pending)


@contextlib.contextmanager
def _read_errors(obj: SourceObject, path: str):
    """Turn a reader's error into one that names the object and says what to do."""
    import pyarrow as pa

    try:
        yield
    except (pa.ArrowException, OSError) as exc:
        if isinstance(exc, FileNotFoundError):
            raise SourceNotFound(f"source object {obj.uri!r} vanished while staging") from exc
        detail = " ".join(str(exc).split())[:300]
        bad_byte = None if obj.format == "parquet" else _first_invalid_utf8(path)
        if bad_byte is not None:
            detail = f"not UTF-8 at byte {bad_byte}"
            advice = "re-encode the file as UTF-8"
        elif "utf8" in detail.lower().replace("-", ""):
            advice = "re-encode the file as UTF-8"
        elif obj.format == "parquet":
            advice = "it is truncated or not Parquet: re-export it, or remove it from the source"
        elif "changed from" in detail or "conversion" in detail.lower() or "schema" in detail:
            advice = (
                "a column changes type within the file: write each column with one type "
                "(text as strings, ids as strings or integers)"
            )
        else:
            advice = f"fix the file so it is valid {obj.format.upper()}, or remove it"
        raise StagingError(
            f"source object {obj.uri!r} cannot be read as {obj.format} ({detail}): {advice}"
        ) from None


def _first_invalid_utf8(path: str) -> int | None:
    """The offset of the first byte that is not valid UTF-8, or None (reads in chunks)."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset = 0
    try:
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                try:
                    decoder.decode(chunk)
                except UnicodeDecodeError as exc:
                    return offset + exc.start
                offset += len(chunk)
            decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        return offset
    except OSError:
        return None
    return None
