import logging
import os
import subprocess
import sys

import pyarrow as pa
import pytest

from trainops.staging.gx_batch import GXBatchValidator, ephemeral_context

NOT_NULL_ID = {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "id"}}
NEWS_ONLY = {
    "type": "expect_column_values_to_be_in_set",
    "kwargs": {"column": "source", "value_set": ["news"]},
}
STARTS_OK = {"type": "expect_column_values_to_match_regex", "kwargs": {"column": "text", "regex": "^ok"}}


def _batch(n: int = 40) -> pa.RecordBatch:
    """Every 7th id null; texts from row 10 on do not start with "ok"; one source not news."""
    return pa.RecordBatch.from_pydict(
        {
            "id": [None if i % 7 == 0 else f"r{i}" for i in range(n)],
            "text": ["ok" if i < 10 else "bad" for i in range(n)],
            "source": ["docs" if i == 3 else "news" for i in range(n)],
        }
    )


def test_a_passing_and_a_failing_expectation_in_suite_order():
    validator = GXBatchValidator([NEWS_ONLY, NOT_NULL_ID])
    batch = pa.RecordBatch.from_pydict({"id": ["a", "b", "c"], "source": ["news", "docs", "news"]})
    assert validator.validate(batch, 0, "id") == [
        {
            "success": False,
            "unexpected_count": 1,
            "element_count": 3,
            "missing_count": 0,
            "rows": [1],
            "values": ["docs"],
            "ids": ["b"],
        },
        {"success": True, "unexpected_count": 0, "element_count": 3, "rows": [], "values": [], "ids": []},
    ]


def test_sample_values_leave_out_nulls_and_cut_long_texts():
    long_ok = {
        "type": "expect_column_value_lengths_to_be_between",
        "kwargs": {"column": "text", "max_value": 5},
    }
    batch = pa.RecordBatch.from_pydict({"id": [None, "b", "c"], "text": ["x" * 300, "fine", "y" * 6]})
    nulls, lengths = GXBatchValidator([NOT_NULL_ID, long_ok]).validate(batch, 0, "id")
    assert (nulls["unexpected_count"], nulls["values"]) == (1, [])  # a null is no sample to show
    assert lengths["values"] == ["x" * 80 + "... (300 characters)", "yyyyyy"]


def test_rows_are_numbered_from_the_offset_and_samples_are_capped():
    validator = GXBatchValidator([STARTS_OK])
    (result,) = validator.validate(_batch(), 1000, "id")
    assert (result["success"], result["unexpected_count"]) == (False, 30)
    assert result["rows"] == [1010, 1011, 1012, 1013, 1014]
    assert "index_list" not in result  # a summary unless asked for every row
    # row 1014 has a null id: the sample ids skip it and look further
    assert result["ids"] == ["r10", "r11", "r12", "r13", "r15"]


def test_complete_names_every_offending_row():
    validator = GXBatchValidator([STARTS_OK, NOT_NULL_ID], complete=True)
    texts, ids = validator.validate(_batch(), 500, "id")
    assert texts["index_list"] == list(range(510, 540))
    assert texts["rows"] == [510, 511, 512, 513, 514]
    assert ids["index_list"] == [500, 507, 514, 521, 528, 535]
    assert ids["ids"] == []  # the offending rows have no id to show


def test_the_validator_is_reused_batch_after_batch():
    validator = GXBatchValidator([NEWS_ONLY])
    assert validator.validate(_batch(), 0, "id")[0]["rows"] == [3]
    clean = pa.RecordBatch.from_pydict({"id": ["x", "y"], "source": ["news", "news"]})
    assert validator.validate(clean, 40, "id")[0]["success"] is True
    assert validator.validate(_batch(), 42, "id")[0]["rows"] == [45]


def test_integer_ids_are_shown_as_strings_and_a_missing_id_column_shows_none():
    validator = GXBatchValidator([NEWS_ONLY])
    batch = pa.RecordBatch.from_pydict({"id": [7, 8, 9], "source": ["news", "forum", "docs"]})
    assert validator.validate(batch, 0, "id")[0]["ids"] == ["8", "9"]
    assert "ids" not in validator.validate(batch, 0, "record_id")[0]


def test_mostly_is_applied_to_the_batch_but_the_counts_are_kept():
    mostly = {"type": "expect_column_values_to_match_regex", "kwargs": {**STARTS_OK["kwargs"], "mostly": 0.2}}
    (result,) = GXBatchValidator([mostly]).validate(_batch(), 0, "id")
    assert (result["success"], result["unexpected_count"], result["element_count"]) == (True, 30, 40)


def test_a_table_expectation_reports_its_observed_value():
    columns = {"type": "expect_table_column_count_to_equal", "kwargs": {"value": 2}}
    (result,) = GXBatchValidator([columns]).validate(_batch(), 0, "id")
    assert result == {"success": False, "observed_value": 3, "rows": [], "values": [], "ids": []}


def test_a_missing_column_fails_with_gx_s_reason():
    lang = {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "lang"}}
    (result,) = GXBatchValidator([lang]).validate(_batch(), 0, "id")
    assert result["success"] is False
    assert 'The column "lang" in BatchData does not exist' in result["error"]


def test_bad_kwargs_are_named_when_the_suite_is_built():
    bad = {
        "type": "expect_column_value_lengths_to_be_between",
        "kwargs": {"column": "text", "min_value": "one"},
    }
    with pytest.raises(
        ValueError,
        match=r"expectation expect_column_value_lengths_to_be_between has invalid kwargs "
        r"\{'column': 'text', 'min_value': 'one'\}: .*min_value",
    ):
        GXBatchValidator([bad])


def test_the_ephemeral_context_writes_nothing_and_keeps_gx_quiet(tmp_path, monkeypatch, caplog):
    import great_expectations as gx

    monkeypatch.chdir(tmp_path)
    caplog.set_level(logging.INFO, logger="great_expectations")  # put back after the test
    first, second = ephemeral_context(), ephemeral_context()
    first.suites.add(gx.ExpectationSuite(name="slices"))
    assert [s.name for s in first.suites.all()] == ["slices"]
    assert list(second.suites.all()) == []  # each context has its own in-memory stores
    assert os.listdir(tmp_path) == []  # no gx/ folder, no docs site
    assert first.config.analytics_enabled is False
    assert (first.config.progress_bars.globally, first.config.progress_bars.metric_calculations) == (
        False,
        False,
    )
    assert logging.getLogger("great_expectations").level == logging.ERROR


def _import_log(code: str) -> str:
    """What importing great_expectations logs at INFO in a fresh interpreter, after ``code``."""
    script = f"import logging\nlogging.basicConfig(level=logging.INFO)\n{code}\nimport great_expectations\n"
    script += "logging.getLogger('great_expectations._docs_decorators').warning('a real GX warning')\n"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stderr


def test_importing_gx_through_trainops_logs_no_registration_noise_but_keeps_warnings():
    plain = _import_log("")
    assert plain.count("Skipping registering function") > 50  # what a stage task's log was full of
    quiet = _import_log("from trainops.staging.gx_batch import quiet_import_noise\nquiet_import_noise()")
    assert "Skipping registering function" not in quiet
    assert "Multiple declarations of metric" not in quiet
    assert "a real GX warning" in quiet
