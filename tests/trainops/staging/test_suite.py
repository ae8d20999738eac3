import json

import pytest

from tests.trainops.staging.helpers import assert_nothing_valid_looking
from trainer.storage import open_storage
from trainops.staging.demo_data import write_demo_dataset
from trainops.staging.errors import DataValidationError, StagingError
from trainops.staging.stage import stage_dataset
from trainops.staging.suite import check_suite_spec, resolve_suite

SUITE = [
    {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "id"}},
    {
        "type": "expect_column_values_to_be_in_set",
        "kwargs": {"column": "source", "value_set": ["news", "forum", "docs"]},
    },
    {"type": "expect_table_row_count_to_be_between", "kwargs": {"min_value": 10}},
]


def _gx_suite():
    import great_expectations as gx

    context = gx.get_context(mode="ephemeral")
    suite = context.suites.add(gx.ExpectationSuite(name="demo"))
    suite.add_expectation(gx.expectations.ExpectColumnValuesToNotBeNull(column="id"))
    suite.add_expectation(
        gx.expectations.ExpectColumnValuesToBeInSet(column="source", value_set=["news", "forum", "docs"])
    )
    suite.add_expectation(gx.expectations.ExpectTableRowCountToBeBetween(min_value=10))
    return suite


def test_every_form_gives_the_same_suite(tmp_path, s3_root):
    import great_expectations as gx

    storage = open_storage(f"file://{tmp_path}")
    gx_suite = _gx_suite()
    storage.put(f"file://{tmp_path}/list.json", json.dumps(SUITE).encode())
    # GX's own serialization: ids, severity, meta and notes are bookkeeping.
    storage.put(f"file://{tmp_path}/gx.json", json.dumps(gx_suite.to_json_dict(), default=str).encode())
    open_storage(s3_root).put(f"{s3_root}/suites/demo.json", json.dumps(SUITE).encode())
    forms = {
        "list": SUITE,
        "callable": lambda: SUITE,
        "gx objects": [
            gx.expectations.ExpectColumnValuesToNotBeNull(column="id"),
            gx.expectations.ExpectColumnValuesToBeInSet(column="source", value_set=["news", "forum", "docs"]),
            gx.expectations.ExpectTableRowCountToBeBetween(min_value=10),
        ],
        "gx suite": gx_suite,
        "callable returning a gx suite": lambda: gx_suite,
        "file list": f"file://{tmp_path}/list.json",
        "file gx": f"file://{tmp_path}/gx.json",
        "s3 list": f"{s3_root}/suites/demo.json",
    }
    for form, spec in forms.items():
        assert resolve_suite(spec) == SUITE, form


@pytest.mark.parametrize(
    "content, message",
    [
        (None, "does not exist: write the suite JSON there"),
        (b"{not json", "is not UTF-8 JSON"),
        (b'{"name": "x"}', "holds a dict: it must hold a list of expectations or a GX suite"),
        (
            b'[{"type": "expect_column_mean_to_be_between", "kwargs": {}}]',
            "'expect_column_mean_to_be_between'",
        ),
    ],
)
def test_bad_suite_files_are_named(tmp_path, content, message):
    uri = f"file://{tmp_path}/suite.json"
    if content is not None:
        open_storage(uri).put(uri, content)
    with pytest.raises(StagingError, match=message) as err:
        resolve_suite(uri)
    assert uri in str(err.value)


def test_a_failing_callable_is_named():
    def build_suite():
        raise KeyError("threshold")

    with pytest.raises(StagingError, match="build_suite raised KeyError"):
        resolve_suite(build_suite)
    with pytest.raises(StagingError, match="must return the suite itself"):
        resolve_suite(lambda: "s3://x/suite.json")


def test_parse_time_check_keeps_callables_and_uris_for_run_time():
    fn = lambda: SUITE  # noqa: E731
    assert check_suite_spec(fn) is fn
    assert check_suite_spec("s3://b/suite.json") == "s3://b/suite.json"
    assert check_suite_spec(SUITE) == SUITE


def test_a_suite_file_drives_validation_and_the_version(file_root, raw_uri, tmp_path):
    source = write_demo_dataset(raw_uri, rows=200, seed=3, files=1)
    storage = open_storage(file_root)
    suite_uri = f"file://{tmp_path}/suites/text.json"
    storage.put(suite_uri, json.dumps(SUITE).encode())
    first = stage_dataset(storage, file_root, source["uri"], "demo", expectations=suite_uri)
    assert stage_dataset(storage, file_root, source["uri"], "demo", expectations=suite_uri)["reused"] is True
    stricter = [
        *SUITE[:1],
        {"type": "expect_column_values_to_be_in_set", "kwargs": {"column": "source", "value_set": ["news"]}},
    ]
    storage.put(suite_uri, json.dumps(stricter).encode())
    before = {u: storage.head(u)["etag"] for u in storage.list(file_root)}
    with pytest.raises(
        DataValidationError, match=r"expect_column_values_to_be_in_set on 'source': [0-9]+ unexpected"
    ) as err:
        stage_dataset(storage, file_root, source["uri"], "demo", expectations=suite_uri)
    assert first["version"] not in err.value.report_uri  # a new suite, a new version
    assert_nothing_valid_looking(storage, file_root, before)
