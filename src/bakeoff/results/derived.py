"""Columns the summary gets beyond the cells' own: sweep axes, roofline, published ratios.

Kept out of ``stages/summary.py`` on purpose: that module turns cells into
rows; this one adds what needs the config (hardware, sweep points) or the
published data. It works on whatever columns the rows have, so columns other
work adds to the summary (quality: ``ppl`` ...) are compared too.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bakeoff.engines.support import predict
from bakeoff.errors import BakeoffError
from bakeoff.layout import variant_name
from bakeoff.results import published, roofline

AXIS_COLUMNS = ["sweep", "overrides"]
# From the doctor (results/hardware.json) and the model config: what was expected, where bandwidth came from.
DOCTOR_COLUMNS = ["predicted_status", "predicted_reason", "bandwidth_source", "synthetic"]


def measured_bandwidth_gbs(hw: Mapping[str, Any], facts: Mapping[str, Any] | None,
                           node: str | None = None) -> float | None:
    """The doctor's measured bandwidth where a row ran: the host copy on CPU, the slowest device copy among
    the GPUs the row's server used on CUDA (each must have one); None where the doctor's record is of another
    node than the row's ``node`` (``node_id``), so one node's figure never stands for another's."""
    facts = facts or {}
    if hw.get("backend") == "cpu":
        if node and node.startswith("host:") and node[5:].split("/")[0] != str(facts.get("host", "")):
            return None
        v = (facts.get("cpu") or {}).get("mem_bandwidth_gbs")
        return float(v) if v else None
    gpus = facts.get("gpus") or []
    if node and node.startswith("gpu:"):
        used = set(node[4:].split(","))
        gpus = [g for g in gpus if g.get("uuid") in used]
        if len(gpus) != len(used):
            return None
    values = [g.get("mem_bandwidth_gbs") for g in gpus]
    return float(min(values)) if values and all(values) else None


def _hardware_for_roofline(hw: Mapping[str, Any], facts: Mapping[str, Any] | None,
                           node: str | None = None) -> tuple[dict[str, Any], str]:
    """The hardware dict the roofline uses, and where its bandwidth came from (``measured`` or ``config``).

    The doctor's measurement on the node the cells ran on replaces the configured figure wherever it has one
    (a configured 20 GB/s put some CPU cells above 100 %; a GPU's datasheet is not the node in hand).
    """
    hw = dict(hw)
    measured = measured_bandwidth_gbs(hw, facts, node)
    if measured:
        hw["mem_bandwidth_gbs"] = measured
        return hw, "measured"
    return hw, "config" if hw.get("mem_bandwidth_gbs") else ""


def _fmt(v: Any) -> Any:
    if isinstance(v, float):
        return f"{v:.6g}"
    return v


def _prediction(facts: Mapping[str, Any] | None, pt: Mapping[str, Any], r: Mapping[str, Any]) -> dict[str, str]:
    """The doctor's expectation for this row's variant (empty without a doctor record)."""
    if not facts or "capabilities" not in facts:
        return {}
    cfg = pt.get("config", {})
    engine, fmt = r.get("engine"), r.get("format")
    plugin = cfg.get("engines", {}).get(engine, {}).get("plugin", engine)
    method = cfg.get("formats", {}).get(fmt, {}).get("method", "")
    return predict(dict(facts), [(engine, plugin, fmt, method)]).get(variant_name(engine, fmt), {})


def extend(rows: list[dict[str, Any]], points: Mapping[str, Any], published_path: Path | None,
           facts: Mapping[str, Any] | None = None) -> list[str]:
    """Add the extra columns to every row in place; returns their names, in order.

    ``points`` maps experiment (sweep point) name -> ``{sweep, overrides, config_hash,
    hardware, engines}`` as :func:`bakeoff.composition.sweep.points_json` writes it.
    """
    cols = [*AXIS_COLUMNS, *DOCTOR_COLUMNS, *roofline.COLUMNS]
    for r in rows:
        pt = points.get(r.get("experiment"))
        if pt is None:
            raise BakeoffError(f"summary row of experiment {r.get('experiment')!r} has no sweep point; "
                               f"known: {sorted(points)}")
        r["sweep"] = pt.get("sweep", "")
        r["overrides"] = pt.get("overrides", "")
        eng = pt.get("engines", {}).get(r.get("engine"), {})
        settings = r.get("engine_settings")
        settings = json.loads(settings) if isinstance(settings, str) and settings else (settings or eng.get("settings"))
        pred = _prediction(facts, pt, r)
        r["predicted_status"] = pred.get("expected", "")
        r["predicted_reason"] = pred.get("reason", "")
        r["synthetic"] = (pt.get("config", {}).get("model", {}).get("source") == "synthetic")
        hw, r["bandwidth_source"] = _hardware_for_roofline(pt["hardware"], facts, r.get("node_id") or None)
        r.update(roofline.row_columns(r, hw, eng.get("plugin"), settings))
    if published_path is not None:
        cols += published.compare(rows, published.load(published_path))
    for r in rows:
        for c in cols:
            r[c] = _fmt(r.get(c, ""))
    return cols
