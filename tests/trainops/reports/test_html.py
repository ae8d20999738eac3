"""The page primitives: what a reader sees of a value, a table or a page, escaped and redacted."""

from __future__ import annotations

import json

import pytest

from tests.trainops.cluster.credential_cases import CREDENTIALS
from tests.trainops.reports.helpers import page_tables, page_text
from trainops.reports.html import (
    CSS,
    dicts,
    escape,
    json_value,
    kv_table,
    list_of,
    not_json_page,
    object_name,
    other_fields,
    page,
    raw_json,
    redact,
    report_link,
    scalar,
    table,
    verdict,
)

ATTACK = "<script>alert('x') & \"y\"</script>"


def test_escape_makes_any_value_text_safe_in_elements_and_attributes():
    assert escape(ATTACK) == "&lt;script&gt;alert(&#x27;x&#x27;) &amp; &quot;y&quot;&lt;/script&gt;"
    assert escape(3) == "3" and escape(None) == "None"


def test_redact_replaces_credential_values_and_url_passwords_at_any_depth():
    assert redact({"token": "t", "eval_tokens": 5, "password": None}) == {
        "token": "***",
        "eval_tokens": 5,
        "password": None,
    }
    report = {
        "aws_secret_access_key": "SECRET-1",
        "nested": [{"session_token": "SECRET-2", "api_key": "", "name": "demo"}],
        "endpoint": "https://user:SECRET-3@minio.local/x",
        "Authorization": "Bearer SECRET-4",
    }
    assert redact(report) == {
        "aws_secret_access_key": "***",
        "nested": [{"session_token": "***", "api_key": "", "name": "demo"}],
        "endpoint": "https://user:***@minio.local/x",
        "Authorization": "***",
    }
    assert report["nested"][0]["session_token"] == "SECRET-2"  # a copy: the input is untouched


def test_redact_knows_credentials_as_job_manifests_do():
    """A job.json records its spec's env: a report page masks what rendering would refuse."""
    env = {name: value for name, value, _ in CREDENTIALS}
    legit = {
        "AWS_REGION": "eu-west-1",
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_DISABLE_IMPLICIT_TOKEN": "1",
    }
    shown = redact({"spec": {"env": {**env, **legit}}})["spec"]["env"]
    assert not [name for name, _, secret in CREDENTIALS if secret in json.dumps(shown)]
    assert {k: v for k, v in shown.items() if v != "***"} == {
        **legit,
        # a secret inside a value is masked alone, so the reader still sees where it points
        "AWS_ENDPOINT_URL_S3": "http://minio-admin:***@minio.storage:9000",
    }
    assert redact({"passed": True, "max_tokens": 512, "path": "/x"}) == {
        "passed": True,
        "max_tokens": 512,
        "path": "/x",
    }
    assert redact("key AKIAIOSFODNN7EXAMPLE in a log line") == "key *** in a log line"


def test_scalars_read_as_json_writes_them():
    assert page_text(scalar(None)) == "null"
    assert [scalar(True), scalar(False)] == ["true", "false"]
    assert scalar(1 / 3) == "0.333333" and scalar(12) == "12"
    assert scalar(ATTACK) == escape(ATTACK)


@pytest.mark.parametrize(
    "ok, yes, no, shown, css",
    [(True, "PASS", "FAIL", "PASS", "pass"), (False, "APPROVED", "REJECTED", "REJECTED", "fail")],
)
def test_verdict_is_coloured_by_outcome(ok, yes, no, shown, css):
    assert verdict(ok, yes, no) == f'<span class="{css}">{shown}</span>'


def test_an_unknown_verdict_says_so():
    assert page_text(verdict(None)) == "unknown"


def test_json_values_become_tables_lists_and_text():
    value = {
        "name": ATTACK,
        "rows": [{"a": 1, "b": 2}, {"b": 3, "c": None}],
        "tags": ["x", 2.5, None],
        "mixed": [1, {"k": "v"}],
        "empty": {},
        "none": [],
    }
    html = json_value(value)
    assert "<script>" not in html
    outer = page_tables(html)[0]
    assert [row[0] for row in outer] == ["name", "rows", "tags", "mixed", "empty", "none"]
    assert dict(outer)["tags"] == "x, 2.5, null"
    assert dict(outer)["empty"] == "{}" and dict(outer)["none"] == "[]"
    # A list of dicts is one table with the union of their keys as columns.
    [rows] = [t for t in page_tables(html) if t[0] == ["a", "b", "c"]]
    assert rows[1:] == [["1", "2", "null"], ["null", "3", "null"]]
    assert "<ol><li>1</li><li>" in html  # a list of mixed values is numbered


def test_dicts_nested_deeper_than_five_levels_are_shown_as_json_text():
    deep: dict = {"leaf": "end"}
    for level in range(6):
        deep = {f"level{level}": deep}
    html = json_value(deep)
    assert html.count("<table>") == 5
    assert "<pre>{\n  &quot;level0&quot;: {\n    &quot;leaf&quot;: &quot;end&quot;\n  }\n}</pre>" in html


def test_tables_take_cell_html_and_key_value_tables_escape_keys():
    assert page_tables(table(["A", "B"], [["1", "<b>2</b>"]])) == [[["A", "B"], ["1", "2"]]]
    assert "<b>2</b>" in table(["A"], [["<b>2</b>"]])  # cells are HTML already
    assert page_tables(kv_table({ATTACK: 1})) == [[[ATTACK, "1"]]]
    assert "<script>" not in kv_table({ATTACK: 1})


def test_other_fields_lists_what_a_page_did_not_show():
    html = other_fields({"shown": 1, "extra": 2}, {"shown"})
    assert page_text(html) == "Other fields (extra) extra 2"
    assert html.startswith('<details class="fold"><summary>')  # folded, closed
    assert other_fields({"shown": 1}, {"shown"}) == ""


def test_raw_json_is_sorted_indented_and_escaped():
    html = raw_json({"b": ATTACK, "a": 1}, "x.json")
    assert page_text(html).startswith('Raw JSON (x.json: 58 bytes, 4 lines) { "a": 1, "b": "<script>')
    assert "<script>" not in html
    assert html.startswith('<details class="fold"><summary>')  # folded, closed
    assert raw_json([], opened=True).startswith('<details class="fold" open><summary>Raw JSON')


def test_report_links_are_relative_and_carry_the_uri_encoded():
    link = report_link("s3://b/r/x y&z.json")
    assert link == (
        '<a href="report?uri=s3%3A%2F%2Fb%2Fr%2Fx+y%26z.json"><code>s3://b/r/x y&amp;z.json</code></a>'
    )


def test_the_page_frame_has_title_uri_and_the_shared_stylesheet():
    html = page(f"Report {ATTACK}", "file:///r/x.json", "<p>body</p>")
    assert html.startswith('<!doctype html><html lang="en">')
    assert f"<title>Report {escape(ATTACK)} - trainops</title>" in html
    assert f"<style>{CSS}</style>" in html
    assert page_text(html) == f"Report {ATTACK} file:///r/x.json body"
    assert '<p class="uri">' not in page("Error", "", "")  # no URI line without a URI


def test_a_json_object_that_does_not_parse_shows_the_error_and_its_text_redacted():
    text = '{"endpoint": "https://u:SECRET@h/x", <b>'
    try:
        json.loads(text)
    except ValueError as exc:
        html = not_json_page("file:///r/runs/d/r/t/job.json", text, exc)
    assert "SECRET" not in html and "<b>" not in html
    shown = page_text(html)
    assert shown.startswith("job.json file:///r/runs/d/r/t/job.json This object is not valid JSON (")
    assert 'its text follows. {"endpoint": "https://u:***@h/x", <b>' in shown


def test_lenient_readers_of_stored_values():
    assert dicts([{"a": 1}, "x", None, {"b": 2}]) == [{"a": 1}, {"b": 2}]
    assert dicts({"a": 1}) == [] and list_of("x") == [] and list_of([1]) == [1]
    assert object_name("s3://b/r/datasets/d/v/validation.json") == "validation.json"
    assert object_name("file:///r/runs/d/") == "d"
