"""Where an expectation suite comes from: code (a list or a callable) or a JSON file at a URI.

Every form ends as the plain list :func:`normalize_expectations` checks, and that list,
not where it came from, is what the dataset version hashes: editing the JSON file gives a
new version, moving it does not.

Accepted forms:

* ``None``: the default suite;
* a list of ``{"type": "expect_...", "kwargs": {...}}`` dicts, or of GX expectation objects
  (``gx.expectations.ExpectColumnValuesToNotBeNull(column="id")``);
* a GX ``ExpectationSuite``;
* a callable taking no arguments that returns any of the above, called when the task runs;
* a ``file://`` or ``s3://`` URI of a JSON file holding either a list as above or a GX suite
  as GX serializes it (``{"name": ..., "expectations": [...]}``).
"""

from __future__ import annotations

import json
from collections.abc import Callable

from trainer.storage import NotFound
from trainer.storage import open_storage as default_open
from trainops.staging.errors import StagingError
from trainops.staging.expectations import normalize_expectations
from trainops.staging.options import URI_SCHEMES


def check_suite_spec(expectations) -> list[dict] | str | Callable | None:
    """What an operator can check at parse time: lists are normalized, a URI's scheme
    checked, a callable kept for later. Raises ValueError for anything else."""
    if expectations is None or callable(expectations):
        return expectations
    if isinstance(expectations, str):
        if not expectations.startswith(URI_SCHEMES):
            raise ValueError(
                f"expectations {expectations!r} is neither a list nor a file:// or s3:// URI of "
                "a suite JSON file: pass the list, a callable returning it, or the file's URI"
            )
        return expectations
    return normalize_expectations(_as_dicts(expectations, "expectations"))


def resolve_suite(
    expectations, *, open_storage: Callable | None = None, task: str = "causal_lm"
) -> list[dict]:
    """The normalized suite for any accepted form (reads the file for a URI); None is ``task``'s
    default suite.

    :param open_storage: ``uri -> storage client`` for a suite at a URI; by default
        ``trainer.storage.open_storage``.
    """
    if callable(expectations):
        name = getattr(expectations, "__qualname__", repr(expectations))
        try:
            produced = expectations()
        except Exception as exc:
            raise StagingError(
                f"the expectations callable {name} raised {type(exc).__name__}: {exc}; "
                "fix it so it returns the suite"
            ) from exc
        if callable(produced) or isinstance(produced, str):
            raise StagingError(
                f"the expectations callable {name} returned {produced!r}: it must return the "
                "suite itself (a list of expectations or a GX suite)"
            )
        return _normalized(produced, f"the suite returned by {name}")
    if isinstance(expectations, str):
        return _normalized(_load(expectations, open_storage), f"suite file {expectations!r}")
    if expectations is None:
        return normalize_expectations(None, task)
    return _normalized(expectations, "expectations")


def _normalized(value, where: str) -> list[dict]:
    try:
        return normalize_expectations(_as_dicts(value, where))
    except ValueError as exc:
        raise StagingError(f"{where}: {exc}") from None


def _load(uri: str, open_storage: Callable | None):
    if open_storage is None:
        open_storage = default_open
    try:
        raw = open_storage(uri).get(uri)
    except NotFound:
        raise StagingError(
            f"expectation suite {uri!r} does not exist: write the suite JSON there or fix "
            "the expectations URI"
        ) from None
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise StagingError(
            f"expectation suite {uri!r} is not UTF-8 JSON ({exc}): write it as a JSON list of "
            "expectations or a GX suite"
        ) from None
    if isinstance(data, dict) and "expectations" in data:
        return data["expectations"]
    if isinstance(data, list):
        return data
    raise StagingError(
        f"expectation suite {uri!r} holds a {type(data).__name__}: it must hold a list of "
        "expectations or a GX suite with an 'expectations' list"
    )


def _as_dicts(value, where: str) -> list:
    """GX suites and expectation objects as plain dicts; plain data passes through."""
    if hasattr(value, "expectations") and hasattr(value, "to_json_dict"):
        value = value.expectations  # a gx.ExpectationSuite
    if not isinstance(value, (list, tuple)):
        return value  # normalize_expectations names the wrong type
    out = []
    for item in value:
        config = getattr(item, "configuration", None)
        if config is not None and hasattr(config, "to_json_dict"):
            item = config.to_json_dict()  # a gx.expectations.Expectation
        out.append(item)
    return out
