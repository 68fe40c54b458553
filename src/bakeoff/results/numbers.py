"""One parser for the numbers in summary rows, published data and cell records.

Why: the summary is a CSV, so every reader gets strings; an empty cell, a
word or NaN means "no number", and each reader must agree on that.
"""

from __future__ import annotations

import math
from typing import Any


def number(v: Any, *, finite: bool = True) -> float | None:
    """``v`` as a float; None for None, "", text and NaN (and for infinities unless ``finite=False``)."""
    if v is None or v == "":
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    if f != f:  # NaN
        return None
    return f if math.isfinite(f) or not finite else None
