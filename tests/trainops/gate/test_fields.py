"""Numeric fields of check definitions: finite numbers, Jinja templates, and how they are shown."""

from __future__ import annotations

import math

import pytest

from trainops.gate.errors import GateConfigError
from trainops.gate.fields import TEMPLATE_MODES, fmt, is_number, number_rule, show

TEMPLATE = "{{ params.max_eval_loss }}"


@pytest.mark.parametrize("templates", TEMPLATE_MODES)
def test_numbers_are_read_as_floats_in_every_mode(templates):
    number = number_rule(templates)
    assert number("check #0", "value", 3) == 3.0 and isinstance(number("check #0", "value", 3), float)
    assert number("check #0", "value", 0.25) == 0.25


def test_templates_are_kept_only_at_parse_and_rendered_text_is_read_as_a_number():
    assert number_rule("allow")("check #0", "value", TEMPLATE) == TEMPLATE
    assert number_rule("rendered")("check #0", "value", " 0.5 ") == 0.5
    with pytest.raises(GateConfigError, match=r"check #0 needs a finite number in field 'value', got '4'"):
        number_rule("allow")("check #0", "value", "4")  # text that is no template is not a number


@pytest.mark.parametrize(
    "templates, value, message",
    [
        (
            None,
            TEMPLATE,
            "check #1 needs a finite number in field 'tolerance', got '{{ params.max_eval_loss }}'",
        ),
        ("rendered", "lots", "check #1 field 'tolerance' rendered to 'lots', which is not a number; fix the"),
        ("rendered", "nan", "check #1 needs a finite number in field 'tolerance', got nan"),
        ("allow", math.inf, "check #1 needs a finite number in field 'tolerance', got inf"),
        (None, True, "check #1 needs a finite number in field 'tolerance', got True"),
        (None, None, "check #1 needs a finite number in field 'tolerance', got None"),
    ],
)
def test_a_bad_field_is_named_with_its_value(templates, value, message):
    with pytest.raises(GateConfigError) as err:
        number_rule(templates)("check #1", "tolerance", value)
    assert str(err.value).startswith(message)


def test_numbers_are_shown_with_six_significant_digits():
    assert [fmt(None), fmt(2.0), fmt(1 / 3), fmt(123456789)] == ["-", "2", "0.333333", "1.23457e+08"]
    assert [show(0.05), show(TEMPLATE), show(None)] == ["0.05", TEMPLATE, "None"]


def test_booleans_are_not_numbers():
    assert is_number(1) and is_number(1.5) and is_number(math.nan)
    assert not is_number(True) and not is_number("1") and not is_number(None)
