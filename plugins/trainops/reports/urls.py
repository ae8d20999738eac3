"""The report app's page for a stored record, as a URL: the one rule the task links, the demo's
summary and the terminal's ``report`` verb build it by. No Airflow import (the terminal has none)."""

from __future__ import annotations

from urllib.parse import urlencode

REPORT_PATH = "/trainops/report"


def report_url(uri: str, base_url: str) -> str:
    """``<base_url>/trainops/report?uri=<uri>`` (``base_url``: Airflow's public URL, "" for a
    host-relative link)."""
    return f"{base_url.rstrip('/')}{REPORT_PATH}?{urlencode({'uri': uri})}"
