"""Columns the summary gets beyond the cells' own: sweep axes, roofline, published ratios.

Kept out of ``stages/summarize.py`` on purpose: that module turns cells into
rows; this one adds what needs the config (hardware, sweep points) or the
published data. It works on whatever columns the rows have, so columns other
work adds to the summary (quality: ``ppl`` ...) are compared too.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bakeoff import published, roofline
from bakeoff.errors import BakeoffError

AXIS_COLUMNS = ["sweep", "overrides"]


def _fmt(v: Any) -> Any:
    if isinstance(v, float):
        return f"{v:.6g}"
    return v


def extend(rows: list[dict[str, Any]], points: Mapping[str, Any], published_path: Path | None) -> list[str]:
    """Add the extra columns to every row in place; returns their names, in order.

    ``points`` maps experiment (sweep point) name -> ``{sweep, overrides, config_hash,
    hardware, engines}`` as :func:`bakeoff.sweep.points_json` writes it.
    """
    cols = [*AXIS_COLUMNS, *roofline.COLUMNS]
    for r in rows:
        pt = points.get(r.get("experiment"))
        if pt is None:
            raise BakeoffError(f"summary row of experiment {r.get('experiment')!r} has no sweep point; "
                               f"known: {sorted(points)}")
        r["sweep"] = pt.get("sweep", "")
        r["overrides"] = pt.get("overrides", "")
        if pt.get("config_hash"):
            r["config_hash"] = pt["config_hash"]
        eng = pt.get("engines", {}).get(r.get("engine"), {})
        settings = r.get("engine_settings")
        settings = json.loads(settings) if isinstance(settings, str) and settings else (settings or eng.get("settings"))
        r.update(roofline.row_columns(r, pt["hardware"], eng.get("plugin"), settings))
    if published_path is not None:
        cols += published.compare(rows, published.load(published_path))
    for r in rows:
        for c in cols:
            r[c] = _fmt(r.get(c, ""))
    return cols
