"""A user's function named in a config value (trainer.config.functions): the form judged where
the config is, the import where the function runs, each error naming the key and the value."""

from __future__ import annotations

import pytest

from trainer.config import ConfigError, builder_parts, config_from_mapping
from trainer.config.functions import function_parts, import_function

MINIMAL = {"run_uri": "file:///r", "data_uri": "file:///d"}


def test_a_module_and_a_function_are_told_apart():
    assert builder_parts("custom_model:build") == ("custom_model", "build")
    assert function_parts("eval.metrics", "team.metrics.text:f1", "m:f") == ("team.metrics.text", "f1")


@pytest.mark.parametrize("value", ["team_metrics", "a:b:c", "class:score", "pkg.mod:score()", 3, ""])
def test_a_value_that_is_not_module_colon_function_is_refused_naming_key_and_example(value):
    with pytest.raises(ConfigError) as info:
        function_parts("eval.metrics", value, "team_metrics:score")
    assert str(info.value) == (
        f"eval.metrics: expected 'module:function', got {value!r}; name an importable module and a "
        "function in it, e.g. 'team_metrics:score'"
    )


def test_the_function_is_imported_or_the_error_says_what_to_fix():
    assert import_function("eval.metrics", "examples.team_metrics:word_f1", "m:f").__name__ == "word_f1"
    with pytest.raises(
        ImportError,
        match=r"^eval.metrics 'nowhere_at_all:f': cannot import 'nowhere_at_all' "
        r"\(ModuleNotFoundError: .*\); put its folder on PYTHONPATH or install it in the trainer image$",
    ):
        import_function("eval.metrics", "nowhere_at_all:f", "m:f")
    with pytest.raises(
        AttributeError,
        match=r"^eval.metrics 'examples.team_metrics:_ARTICLES': module "
        r"'examples.team_metrics' has no function '_ARTICLES'$",
    ):
        import_function("eval.metrics", "examples.team_metrics:_ARTICLES", "m:f")  # a pattern, not a function


def test_eval_metrics_are_a_list_of_scorers_each_once():
    config = config_from_mapping({**MINIMAL, "eval": {"metrics": ["team_metrics:score", "b.c:d"]}})
    assert config.eval.metrics == ["team_metrics:score", "b.c:d"]
    # one scorer as a plain string, as a command line override gives it
    assert config_from_mapping({**MINIMAL, "eval": {"metrics": "team_metrics:score"}}).eval.metrics == [
        "team_metrics:score"
    ]
    with pytest.raises(ConfigError, match=r"^eval.metrics: 'a:b' is listed twice; list each scorer once$"):
        config_from_mapping({**MINIMAL, "eval": {"metrics": ["a:b", "a:b"]}})
    with pytest.raises(ConfigError, match=r"^eval.metrics: expected a list of strings, got \[1\]$"):
        config_from_mapping({**MINIMAL, "eval": {"metrics": [1]}})
    with pytest.raises(ConfigError, match=r"^eval.metrics: expected 'module:function', got 'score'"):
        config_from_mapping({**MINIMAL, "eval": {"metrics": ["score"]}})
