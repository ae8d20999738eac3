"""Check a source object's columns and types before its rows are read (pure)."""

from __future__ import annotations

from collections.abc import Sequence

from trainops.staging.errors import StagingError


def check_schema(uri: str, schema, *, id_column: str, text_column: str, slice_columns: Sequence[str]) -> None:
    """Raise StagingError naming the object, the column and the fix, for a schema staging
    cannot use: a missing column, text that is not a string, an id that is neither a string
    nor an integer, or a slice column holding nested values."""
    import pyarrow as pa

    names = schema.names
    required = list(dict.fromkeys([id_column, text_column, *slice_columns]))
    missing = [c for c in required if c not in names]
    if missing:
        raise StagingError(
            f"source object {uri!r} lacks columns {missing} (it has {names}): add them to the "
            "data, or change slice_columns"
        )
    text = schema.field(text_column).type
    if not (_is_string(text) or pa.types.is_null(text)):
        raise StagingError(
            f"source object {uri!r} has column {text_column!r} of type {text}, but staging "
            f"tokenizes text: write {text_column!r} as strings"
        )
    ident = schema.field(id_column).type
    if not (_is_string(ident) or pa.types.is_integer(ident) or pa.types.is_null(ident)):
        raise StagingError(
            f"source object {uri!r} has column {id_column!r} of type {ident}, but record ids "
            f"must be strings or integers: write {id_column!r} as one of those"
        )
    for column in slice_columns:
        kind = schema.field(column).type
        if pa.types.is_nested(kind) or pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
            raise StagingError(
                f"source object {uri!r} has slice column {column!r} of type {kind}; the eval "
                "index needs scalar values: use a string or number column"
            )


def _is_string(kind) -> bool:
    import pyarrow as pa

    return pa.types.is_string(kind) or pa.types.is_large_string(kind) or (pa.types.is_string_view(kind))
