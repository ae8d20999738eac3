"""Check a source object's columns and types before its rows are read, and that every object
of a source gives each column the same kind of type (pure)."""

from __future__ import annotations

from collections.abc import Sequence

from trainops.staging.errors import StagingError


def check_schema(
    uri: str, schema, *, id_column: str, text_column: str | Sequence[str], slice_columns: Sequence[str]
) -> None:
    """Raise StagingError naming the object, the column and the fix, for a schema staging
    cannot use: a missing column, text that is not a string, an id that is neither a string
    nor an integer, or a slice column holding nested values. ``text_column`` may name several
    (an ``sft`` source's prompt and response)."""
    import pyarrow as pa

    names = schema.names
    texts = [text_column] if isinstance(text_column, str) else list(text_column)
    required = list(dict.fromkeys([id_column, *texts, *slice_columns]))
    missing = [c for c in required if c not in names]
    if missing:
        raise StagingError(
            f"source object {uri!r} lacks columns {missing} (it has {names}): add them to the "
            "data, or change slice_columns"
        )
    for column in texts:
        text = schema.field(column).type
        if not (_is_string(text) or pa.types.is_null(text)):
            raise StagingError(
                f"source object {uri!r} has column {column!r} of type {text}, but staging "
                f"tokenizes text: write {column!r} as strings"
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


def type_kind(kind, *, id_column: bool = False) -> str | None:
    """The kind of an Arrow type, as staging and the expectations see a column: None for a
    column with no values in a file (it agrees with any), ``string`` for every string type,
    ``number`` for integers, floats and decimals (JSON gives ``1`` and ``1.5`` different types),
    ``timestamp`` (or ``timestamp with time zone``) whatever the unit, the value type of a
    dictionary column, and the type itself otherwise. An id column's integers and strings
    are one kind: staging reads every id as text."""
    import pyarrow as pa

    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    if pa.types.is_null(kind):
        return None
    if _is_string(kind):
        return "id" if id_column else "string"
    if pa.types.is_integer(kind):
        return "id" if id_column else "number"
    if pa.types.is_floating(kind) or pa.types.is_decimal(kind):
        return "number"
    if pa.types.is_timestamp(kind):
        return "timestamp with time zone" if kind.tz else "timestamp"
    return str(kind)


class SchemaDrift:
    """The first type each column had, and in which object; :meth:`add` names the columns a
    later object gives another kind of type (``created_at`` a timestamp in one file, a string
    in the next), which the expectations would check one way in one file and another way in
    the next.

    :param id_column: the record id column (integers and strings agree there).
    """

    def __init__(self, id_column: str) -> None:
        self.id_column = id_column
        self.first: dict[str, tuple[str, str, str]] = {}  # column -> (kind, type, object uri)

    def add(self, uri: str, schema) -> list[str]:
        """Record ``uri``'s column types; one line per column that disagrees with an earlier object."""
        problems = []
        for field in schema:
            kind = type_kind(field.type, id_column=field.name == self.id_column)
            if kind is None:
                continue
            seen = self.first.setdefault(field.name, (kind, str(field.type), uri))
            if seen[0] != kind:
                problems.append(f"{field.name!r} is {seen[1]} in {seen[2]!r} but {field.type} in {uri!r}")
        return problems


def drift_error(problems: Sequence[str]) -> StagingError:
    """The error for columns whose type drifts between a source's objects."""
    shown = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
    return StagingError(
        f"the source's objects disagree on column types, so nothing was staged: {shown}; write each "
        "column with one type in every file (or cast it before staging)"
    )
