"""The one way trainops writes an amount of money: the report pages, ``python -m trainops
cost``, the dry run's estimate and the demo summary all call :func:`money`.

The rule: cents with thousands separators from one cent up (``$1,234.56``); below a cent, two
significant digits in plain decimals (``$0.0042``), because a tiny run (the demo, a test) costs
fractions of a cent and ``$0.00`` would say it cost nothing; zero is ``$0.00``; a negative
amount (a negative saving) is ``-$1.23``; a missing or non-finite value is ``-``.
"""

from __future__ import annotations

import math

__all__ = ["money"]


def money(value: object) -> str:
    """``value``, an amount in USD, as text by the rule above."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return "-"
    amount = float(value)
    if amount < 0:
        return "-" + money(-amount)
    rounded = float(f"{amount:.2g}")  # two significant digits, the rule below a cent
    if amount == 0 or rounded >= 0.01:
        return f"${amount:,.2f}"
    decimals = 1 - math.floor(math.log10(rounded))
    return f"${rounded:.{decimals}f}"
