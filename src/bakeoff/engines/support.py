"""Which variants the doctor's hardware record says can run: each engine judges its own formats.

Why here and not in the doctor: the doctor records what the hardware can do
(compute capability, BF16, FP8 paths); only an engine knows which of its
formats need which capability (``Engine.predict_support``).
"""

from __future__ import annotations

from typing import Any

from bakeoff.config.schema import Config
from bakeoff.engines.base import get_engine
from bakeoff.layout import variant_name


def variants_of(cfg: Config) -> list[tuple[str, str, str, str]]:
    """(engine, plugin, format, quant method) of every variant: what a prediction depends on."""
    return [(e, cfg.engines[e].plugin, f, cfg.formats[f].method) for e, f in cfg.variants()]


def predict(report: dict[str, Any], variants: list[tuple[str, str, str, str]]) -> dict[str, dict[str, str]]:
    """Expected status of each variant from the doctor's record: supported, or unsupported with the reason.

    Kept out of ``hardware.json`` itself so the record depends on the node and
    the hardware config only (one doctor run serves every experiment on it).
    """
    caps, cc = report["capabilities"], report.get("compute_capability")
    out: dict[str, dict[str, str]] = {}
    for engine, plugin, fmt, method in variants:
        status, reason = get_engine(plugin).predict_support(method, caps, cc)
        out[variant_name(engine, fmt)] = {"expected": status, "reason": reason}
    return out
