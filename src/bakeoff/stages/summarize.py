"""Stage: ``results/summary.csv``, one row per (engine, format) variant.

Until load tests exist, a row records what was prepared for the variant: the
artifact's weight bytes, bits per weight and provenance. Written atomically
(temp file + rename) so a reader never sees half a CSV.
"""

from __future__ import annotations

import csv
import os
from pathlib import Path

from bakeoff.manifest import verify
from bakeoff.schema import Config

COLUMNS = ["experiment", "model", "engine", "format", "hardware", "status", "reason", "n_params", "weight_bytes",
           "bits_per_weight", "tool", "derived_from", "config_hash"]


def rows(cfg: Config, models_root: Path, config_hash: str) -> list[dict]:
    out = []
    for engine, fmt in cfg.variants():
        m = verify(models_root / cfg.model.name / fmt)
        tool = m.get("tool", {})
        out.append({
            "experiment": cfg.experiment.name,
            "model": cfg.model.name,
            "engine": engine,
            "format": fmt,
            "hardware": cfg.hardware.name,
            "status": "prepared",
            "reason": "",
            "n_params": m.get("n_params"),
            "weight_bytes": m.get("weight_bytes"),
            "bits_per_weight": m.get("bits_per_weight"),
            "tool": f"{tool.get('name', '')} {tool.get('version', '')}".strip(),
            "derived_from": m.get("derived_from", ""),
            "config_hash": config_hash,
        })
    return out


def write_csv(path: Path, records: list[dict], columns: list[str] = COLUMNS) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.partial-{os.getpid()}")
    try:
        with open(tmp, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=columns, extrasaction="raise")
            w.writeheader()
            w.writerows(records)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
