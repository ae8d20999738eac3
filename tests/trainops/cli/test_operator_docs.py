"""docs/operators.md's parameter tables are the operators' docstrings, row for row."""

import inspect
import subprocess
import sys
from pathlib import Path

import pytest

from trainops.cli.operator_docs import DocsError, main, operators, param_docs, render, replace_block, rows

DOC = Path(__file__).resolve().parents[3] / "docs" / "operators.md"


def test_the_committed_tables_are_what_the_docstrings_generate():
    text = DOC.read_text()
    assert replace_block(text, render()) == text, (
        "docs/operators.md differs from the operators' docstrings; run "
        "`python -m trainops.cli.operator_docs docs/operators.md` and commit the result"
    )


@pytest.mark.parametrize("operator", operators(), ids=lambda c: c.__name__)
def test_every_parameter_of_every_operator_has_a_row(operator):
    documented = {name for name, _, _ in rows(operator)}
    own = {n for n in inspect.signature(operator.__init__).parameters if n not in ("self", "kwargs")}
    assert own <= documented
    assert f"| `{sorted(own)[0]}` |" in DOC.read_text()


class _Base:
    """A base.

    :param shared: a parameter the subclass passes on through ``**kwargs``.
    """

    __module__ = "trainops.fake"

    def __init__(self, *, shared: float = 600.0, **kwargs):
        pass


class _Op(_Base):
    """An operator.

    :param source: where from, over
        two lines (``file://`` or ``s3://``; see :mod:`trainops.staging`).
    :param mode: ``a`` | ``b``.
    """

    __module__ = "trainops.fake"

    def __init__(self, *, source: str, mode: str = "a", **kwargs):
        super().__init__(**kwargs)


def test_a_row_has_the_signature_default_and_the_docstring_text_as_markdown():
    assert rows(_Op) == [
        ("source", "required", "where from, over two lines (`file://` or `s3://`; see `trainops.staging`)."),
        ("mode", "`'a'`", "`a` \\| `b`."),
        ("shared", "`600.0`", "a parameter the subclass passes on through `**kwargs`."),
    ]


def test_a_parameter_without_a_param_line_is_an_error_naming_it():
    class _Undocumented(_Op):
        """No params documented here."""

        __module__ = "trainops.fake"

        def __init__(self, *, threshold: int = 3, **kwargs):
            super().__init__(**kwargs)

    with pytest.raises(DocsError, match=r"_Undocumented.__init__ takes 'threshold' .* ':param threshold:'"):
        rows(_Undocumented)


def test_a_changed_docstring_makes_the_committed_file_stale():
    text = DOC.read_text()
    changed = render().replace("| `dataset_name` | required |", "| `dataset_name` | `'x'` |", 1)
    assert changed != render()
    assert replace_block(text, changed) != text


def test_param_docs_stops_at_the_end_of_an_entry():
    doc = """Summary.

    :param a: one
        two
    :param b: three

    Returns something that is not part of b.
    """
    assert param_docs(doc) == {"a": "one two", "b": "three"}


def test_write_rewrites_only_the_block(tmp_path):
    from trainops.cli.operator_docs import BEGIN, END

    doc = tmp_path / "ops.md"
    doc.write_text(f"# Prose kept\n\n{BEGIN}\nOLD-TABLE\n{END}\n\nmore prose\n")
    assert main([str(doc)]) == 0
    out = doc.read_text()
    assert out.startswith("# Prose kept\n\n") and out.endswith("\n\nmore prose\n")
    assert "### FSDPTrainingOperator parameters" in out and "OLD-TABLE" not in out


def test_a_file_without_markers_is_refused_with_a_message(tmp_path, capsys):
    doc = tmp_path / "ops.md"
    doc.write_text("# no markers\n")
    assert main([str(doc)]) == 2
    assert "no generated block" in capsys.readouterr().err
    assert doc.read_text() == "# no markers\n"


def test_runs_as_a_module_and_prints_the_tables():
    out = subprocess.run(
        [sys.executable, "-m", "trainops.cli.operator_docs"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert "| `api_outage_tolerance` |" in out.stdout and out.stdout.count("### ") == len(operators()) == 7
