"""Great Expectations on one record batch: an ephemeral context and suite built once, reused.

Each batch becomes a pandas DataFrame indexed by the rows' numbers in the source, so the
row numbers GX reports are the source's. Results come back as plain dicts.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from trainops.staging.expectations import ROW_EXPECTATIONS

_SAMPLES = 5
# A sample value longer than this is cut in the report (a text over its length limit can be long).
_SAMPLE_CHARS = 80
# great_expectations logs at INFO while it is first imported: its public-API registry (over 200
# "Skipping registering function ... because it is a closure" lines) and its metric registry
# ("Multiple declarations of metric ..."). Nothing to act on, so these two loggers are set to
# WARNING before the import; GX's own warnings and errors still reach the task log.
IMPORT_NOISE_LOGGERS = ("great_expectations._docs_decorators", "great_expectations.expectations.registry")


def quiet_import_noise() -> None:
    """Silence GX's import-time INFO lines (:data:`IMPORT_NOISE_LOGGERS`); call before importing it."""
    for name in IMPORT_NOISE_LOGGERS:
        logger = logging.getLogger(name)
        if logger.level < logging.WARNING:  # NOTSET included; a stricter level is kept
            logger.setLevel(logging.WARNING)


def ephemeral_context():
    """A quiet GX Core ephemeral context: in-memory stores, no docs, analytics or progress
    bars (staging's batch validation and the gate's slice checks both use it)."""
    quiet_import_noise()
    import great_expectations as gx
    from great_expectations.data_context.types.base import (
        DataContextConfig,
        InMemoryStoreBackendDefaults,
        ProgressBarsConfig,
    )

    logging.getLogger("great_expectations").setLevel(logging.ERROR)
    config = DataContextConfig(
        store_backend_defaults=InMemoryStoreBackendDefaults(init_temp_docs_sites=False),
        analytics_enabled=False,
        progress_bars=ProgressBarsConfig(globally=False, metric_calculations=False),
    )
    return gx.get_context(mode="ephemeral", project_config=config)


def add_suite(context, name: str, expectations: list[dict]):
    """A GX suite of the row ``expectations`` (normalized dicts), added to ``context``;
    ValueError naming the expectation whose kwargs GX refuses."""
    quiet_import_noise()
    import great_expectations as gx

    suite = gx.ExpectationSuite(name=name)
    for e in expectations:
        cls = getattr(gx.expectations, ROW_EXPECTATIONS[e["type"]])
        try:
            suite.add_expectation(cls(**e["kwargs"]))
        except Exception as exc:
            detail = " ".join(str(exc).split())
            raise ValueError(
                f"expectation {e['type']} has invalid kwargs {e['kwargs']!r}: {detail}"
            ) from None
    return context.suites.add(suite)


class GXBatchValidator:
    """One ephemeral GX context and suite, reused for every batch.

    :param complete: ask GX for every offending row's index (``COMPLETE`` result format),
        which quarantine needs; otherwise a summary with a few sample rows.
    """

    def __init__(self, expectations: list[dict], *, complete: bool = False):
        context = ephemeral_context()
        name = f"trainops-{uuid.uuid4().hex[:8]}"
        asset = context.data_sources.add_pandas(name).add_dataframe_asset(name)
        self._batch_definition = asset.add_batch_definition_whole_dataframe(name)
        self._suite = add_suite(context, name, expectations)
        self._ids = [x.id for x in self._suite.expectations]
        self._complete = complete

    def validate(self, batch, offset: int, id_column: str) -> list[dict]:
        """Per-expectation results for one batch, in suite order; rows numbered from offset.

        Each result has ``success`` and, where GX counts rows, ``unexpected_count``,
        ``element_count``, ``missing_count``, a few ``rows``, ``ids`` and ``values`` (the
        offending values that are not null, long texts cut), and with
        ``complete`` the full ``index_list`` of offending rows.
        """
        import pandas as pd

        df = batch.to_pandas()
        df.index = pd.RangeIndex(offset, offset + len(df))
        gx_batch = self._batch_definition.get_batch(batch_parameters={"dataframe": df})
        fmt = "COMPLETE" if self._complete else "SUMMARY"
        res = gx_batch.validate(
            self._suite, result_format={"result_format": fmt, "partial_unexpected_count": 20}
        )
        by_id = {r.expectation_config.id: r for r in res.results}
        return [_batch_result(by_id[i], df, id_column, self._complete) for i in self._ids]


def _batch_result(r, df, id_column: str, complete: bool) -> dict:
    out: dict[str, Any] = {"success": bool(r.success)}
    err = exception_message(r.exception_info)
    if err:
        out["success"] = False
        out["error"] = err
        return out
    result = r.result or {}
    for key in ("unexpected_count", "element_count", "missing_count"):
        if result.get(key) is not None:
            out[key] = int(result[key])
    if "observed_value" in result:
        out["observed_value"] = plain(result["observed_value"])
    rows = [int(i) for i in result.get("partial_unexpected_index_list") or [] if _is_int(i)]
    if complete and result.get("unexpected_index_list") is not None:
        index = [int(i) for i in result["unexpected_index_list"] if _is_int(i)]
        if len(index) == len(result["unexpected_index_list"]):
            out["index_list"] = index
            rows = index
    out["rows"] = rows[:_SAMPLES]
    out["values"] = sample_values(result.get("partial_unexpected_list") or [])
    if id_column in df.columns:
        ids = (df.at[i, id_column] for i in rows[: _SAMPLES * 4])
        out["ids"] = [str(v) for v in ids if isinstance(v, str) or (v is not None and v == v)][:_SAMPLES]
    return out


def sample_values(values) -> list:
    """The first few offending values worth showing: JSON-safe, not null nor NaN (a null is no
    sample), a long text cut to its start and its length."""
    out = []
    for value in map(plain, values):
        if value is None or value != value:
            continue
        if isinstance(value, str) and len(value) > _SAMPLE_CHARS:
            value = value[:_SAMPLE_CHARS] + f"... ({len(value):,} characters)"
        out.append(value)
        if len(out) == _SAMPLES:
            break
    return out


def exception_message(info) -> str | None:
    if not isinstance(info, dict):
        return None
    if "raised_exception" in info:
        return info.get("exception_message") if info.get("raised_exception") else None
    for value in info.values():
        msg = exception_message(value)
        if msg:
            return msg
    return None


def _is_int(value) -> bool:
    try:
        return int(value) == value
    except (TypeError, ValueError):
        return False


def plain(value):
    """Make a GX observed value JSON-safe."""
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if hasattr(value, "item"):  # numpy scalars
        return plain(value.item())
    return str(value)
