import re

import pyarrow as pa
import pytest

from trainops.staging.errors import StagingError
from trainops.staging.schema import check_schema

URI = "s3://bucket/raw/part-3.parquet"
COLUMNS = {"id_column": "id", "text_column": "text", "slice_columns": ["source"]}


def _check(fields: dict, **columns) -> None:
    check_schema(URI, pa.schema(list(fields.items())), **{**COLUMNS, **columns})


@pytest.mark.parametrize(
    "fields",
    [
        {"id": pa.string(), "text": pa.string(), "source": pa.string()},
        {"id": pa.int64(), "text": pa.large_string(), "source": pa.int32(), "extra": pa.list_(pa.int8())},
        {"id": pa.uint32(), "text": pa.string_view(), "source": pa.timestamp("us", tz="UTC")},
        {
            "id": pa.null(),
            "text": pa.null(),
            "source": pa.null(),
        },  # JSONL/CSV of only nulls: left to the rows
        {"text": pa.string(), "source": pa.float64(), "id": pa.large_string()},
    ],
)
def test_schemas_staging_can_use_pass(fields):
    _check(fields)


def test_missing_columns_are_listed_with_what_the_object_has():
    with pytest.raises(
        StagingError,
        match=re.escape(
            f"source object {URI!r} lacks columns ['id', 'lang'] (it has ['text', 'source']): add them "
            "to the data, or change slice_columns"
        ),
    ):
        _check({"text": pa.string(), "source": pa.string()}, slice_columns=["source", "lang", "lang"])


def test_other_id_and_text_columns_are_the_ones_required():
    _check({"doc": pa.int64(), "body": pa.string()}, id_column="doc", text_column="body", slice_columns=[])
    with pytest.raises(StagingError, match=r"lacks columns \['body'\]"):
        _check(
            {"doc": pa.int64(), "text": pa.string()}, id_column="doc", text_column="body", slice_columns=[]
        )


@pytest.mark.parametrize(
    "fields, message",
    [
        (
            {"id": pa.string(), "text": pa.int64(), "source": pa.string()},
            "has column 'text' of type int64, but staging tokenizes text: write 'text' as strings",
        ),
        (
            {"id": pa.string(), "text": pa.binary(), "source": pa.string()},
            "has column 'text' of type binary, but staging tokenizes text",
        ),
        (
            {"id": pa.float64(), "text": pa.string(), "source": pa.string()},
            "has column 'id' of type double, but record ids must be strings or integers: write 'id' as "
            "one of those",
        ),
        (
            {"id": pa.string(), "text": pa.string(), "source": pa.list_(pa.string())},
            "has slice column 'source' of type list<item: string>; the eval index needs scalar values: use "
            "a string or number column",
        ),
        (
            {"id": pa.string(), "text": pa.string(), "source": pa.struct([("lang", pa.string())])},
            "has slice column 'source' of type struct<lang: string>",
        ),
        (
            {"id": pa.string(), "text": pa.string(), "source": pa.large_binary()},
            "has slice column 'source' of type large_binary",
        ),
    ],
)
def test_a_type_staging_cannot_use_is_named_with_the_fix(fields, message):
    with pytest.raises(StagingError, match=f"^source object {re.escape(repr(URI))} {re.escape(message)}"):
        _check(fields)


def test_type_kinds_ignore_widths_units_and_encodings():
    from trainops.staging.schema import type_kind

    assert type_kind(pa.null()) is None
    assert (
        type_kind(pa.string())
        == type_kind(pa.large_string())
        == type_kind(pa.dictionary(pa.int8(), pa.string()))
    )
    assert type_kind(pa.int32()) == type_kind(pa.int64()) == type_kind(pa.float64()) == "number"
    assert type_kind(pa.timestamp("s")) == type_kind(pa.timestamp("us")) == "timestamp"
    assert type_kind(pa.timestamp("us", tz="UTC")) == "timestamp with time zone"
    assert type_kind(pa.int64(), id_column=True) == type_kind(
        pa.string(), id_column=True
    )  # ids are read as text
    assert type_kind(pa.list_(pa.int64())) == "list<item: int64>"


def test_a_column_whose_type_drifts_between_objects_is_named_with_both():
    from trainops.staging.schema import SchemaDrift, drift_error

    drift = SchemaDrift("id")
    base = [("id", pa.int64()), ("text", pa.string()), ("created_at", pa.timestamp("us", tz="UTC"))]
    assert drift.add("file:///raw/a.parquet", pa.schema(base)) == []
    agreeing = [("id", pa.string()), ("text", pa.large_string()), ("created_at", pa.null()), ("n", pa.int8())]
    assert drift.add("file:///raw/b.jsonl", pa.schema(agreeing)) == []
    drifting = [("id", pa.int32()), ("text", pa.string()), ("created_at", pa.string()), ("n", pa.string())]
    problems = drift.add("file:///raw/c.parquet", pa.schema(drifting))
    assert problems == [
        "'created_at' is timestamp[us, tz=UTC] in 'file:///raw/a.parquet' but string in 'file:///raw/c.parquet'",
        "'n' is int8 in 'file:///raw/b.jsonl' but string in 'file:///raw/c.parquet'",
    ]
    assert str(drift_error(problems)) == (
        "the source's objects disagree on column types, so nothing was staged: "
        + "; ".join(problems)
        + "; write each column with one type in every file (or cast it before staging)"
    )
    assert str(drift_error([f"p{i}" for i in range(7)])).count("; and 2 more;") == 1
