import pytest

from trainops.staging.expectations import DEFAULT_EXPECTATIONS, normalize_expectations


def test_default_suite_is_the_documented_one():
    suite = normalize_expectations(None)
    assert suite == DEFAULT_EXPECTATIONS
    assert suite is not DEFAULT_EXPECTATIONS
    types = [(e["type"], e["kwargs"].get("column")) for e in suite]
    assert types == [
        ("expect_column_values_to_not_be_null", "id"),
        ("expect_column_values_to_be_unique", "id"),
        ("expect_column_values_to_not_be_null", "text"),
        ("expect_column_value_lengths_to_be_between", "text"),
        ("expect_column_values_to_not_be_null", "source"),
        ("expect_table_row_count_to_be_between", None),
    ]


def test_unknown_type_is_named():
    with pytest.raises(
        ValueError, match="unknown or unsupported expectation type 'expect_column_values_to_be_shiny'"
    ):
        normalize_expectations([{"type": "expect_column_values_to_be_shiny", "kwargs": {}}])


def test_aggregate_expectations_are_refused_not_misapplied():
    with pytest.raises(ValueError, match="'expect_column_mean_to_be_between'"):
        normalize_expectations(
            [{"type": "expect_column_mean_to_be_between", "kwargs": {"column": "x", "min_value": 1}}]
        )


@pytest.mark.parametrize(
    "suite, message",
    [
        ({"type": "x"}, "must be a list"),
        (["expect_column_values_to_not_be_null"], "must be a dict with a string 'type'"),
        ([{"type": "expect_column_values_to_not_be_null", "kwargs": ["id"]}], "kwargs must be a dict"),
        ([{"type": "expect_column_values_to_not_be_null", "kwarg": {}}], "unknown keys \\['kwarg'\\]"),
        (
            [{"type": "expect_column_values_to_be_unique", "kwargs": {"column": "id", "mostly": 0.9}}],
            "unsupported kwargs \\['mostly'\\]",
        ),
        ([{"type": "expect_table_row_count_to_be_between", "kwargs": {}}], "needs min_value or max_value"),
    ],
)
def test_bad_shapes_say_what_is_wrong(suite, message):
    with pytest.raises(ValueError, match=message):
        normalize_expectations(suite)


def test_gx_bookkeeping_kwargs_are_dropped():
    suite = normalize_expectations(
        [
            {
                "type": "expect_column_values_to_not_be_null",
                "kwargs": {"column": "id", "batch_id": "b-1"},
                "meta": {},
            }
        ]
    )
    assert suite == [{"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "id"}}]
