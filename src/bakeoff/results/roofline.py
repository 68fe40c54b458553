"""Decode roofline: how close a cell's decode speed comes to the memory-bandwidth bound.

Definition (precise, because "efficiency" is easy to define two ways):

* Decoding one step of a batch of ``c`` running sequences reads every weight
  once, whatever ``c`` is, and yields one token per sequence. When the step is
  bound by memory bandwidth ``B`` (bytes/s) over the weight bytes ``W``, it
  cannot take less than ``W / B`` seconds.
* **Per-sequence ceiling** ``B / W`` tokens/s: the fastest one sequence can
  decode, at any concurrency (``decode_ceiling_tok_s``).
* **Aggregate ceiling at concurrency c**: ``min(c * B / W, F / (2 N))``, where
  ``F`` is the peak FLOP/s and ``N`` the parameter count (2 FLOPs per
  parameter per token): large batches become compute-bound
  (``decode_ceiling_aggregate_tok_s``; without ``F`` only the bandwidth term).
* **Efficiency** ``decode_efficiency_pct = 100 * (1000 / median TPOT ms) / (B / W)``:
  the measured per-sequence decode rate (TPOT excludes the prefill) over the
  per-sequence ceiling. At c=1 this is single-stream decode vs the bound; at
  c>1 it equals aggregate decode over ``c * B / W`` when all c sequences decode
  together. It ignores KV-cache reads (they grow with context and c), so it is
  an upper bound on what is reachable. A reading above 100 % means B is
  understated (the CPU's configured estimate) or the weights partly fit in
  cache (tiny models): measure B rather than trust it then.

``B`` is ``hardware.mem_bandwidth_gbs`` (per GPU; on CPU, the configured or
measured system bandwidth), times the GPUs that read disjoint weight shards in
parallel, as each engine says (``Engine.weight_shards``: vLLM's tensor-parallel
size, llama.cpp's ``-sm row``; llama.cpp's default layer split runs its GPUs one
after the other for a token, so it gets one GPU's bandwidth).
``W`` is the served weight bytes (``weight_bytes`` of the summary).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bakeoff.engines import get_engine
from bakeoff.results.numbers import number

COLUMNS = ["decode_tok_s", "mem_bandwidth_gbs", "decode_ceiling_tok_s", "decode_ceiling_aggregate_tok_s",
           "decode_efficiency_pct"]




def effective_bandwidth_gbs(hardware: Mapping[str, Any], engine_plugin: str | None,
                            engine_settings: Mapping[str, Any] | None) -> float | None:
    """Bandwidth that feeds one decode step (GB/s), or None when the hardware config has none."""
    bw = number(hardware.get("mem_bandwidth_gbs"), finite=False)
    if bw is None:
        return None
    shards = get_engine(engine_plugin).weight_shards(hardware, engine_settings or {}) if engine_plugin else 1
    return bw * max(1, shards)


def decode_ceiling(bandwidth_gbs: float, weight_bytes: float) -> float:
    """Per-sequence decode ceiling, tokens/s: bandwidth / weight bytes read per token."""
    if weight_bytes <= 0 or bandwidth_gbs <= 0:
        raise ValueError(f"need positive bandwidth and weight bytes, got {bandwidth_gbs} GB/s, {weight_bytes} B")
    return bandwidth_gbs * 1e9 / weight_bytes


def aggregate_ceiling(bandwidth_gbs: float, weight_bytes: float, concurrency: int,
                      peak_tflops: float | None = None, n_params: float | None = None) -> float:
    """Aggregate decode ceiling at concurrency c: min(c * B / W, F / 2N)."""
    mem = concurrency * decode_ceiling(bandwidth_gbs, weight_bytes)
    if peak_tflops and n_params:
        return min(mem, peak_tflops * 1e12 / (2.0 * n_params))
    return mem


def row_columns(row: Mapping[str, Any], hardware: Mapping[str, Any], engine_plugin: str | None,
                engine_settings: Mapping[str, Any] | None) -> dict[str, Any]:
    """The roofline columns of one summary row (empty strings where an input is missing)."""
    out: dict[str, Any] = dict.fromkeys(COLUMNS, "")
    tpot = number(row.get("median_tpot_ms"), finite=False)
    if tpot and tpot > 0:
        out["decode_tok_s"] = 1000.0 / tpot
    bw = effective_bandwidth_gbs(hardware, engine_plugin, engine_settings)
    w = number(row.get("weight_bytes"), finite=False)
    if bw is None or not w or w <= 0:
        return out
    out["mem_bandwidth_gbs"] = bw
    ceil = decode_ceiling(bw, w)
    out["decode_ceiling_tok_s"] = ceil
    c = number(row.get("concurrency"), finite=False)
    if c:
        gpus = max(1, int(hardware.get("gpus") or 0))
        peak = number(hardware.get("peak_tflops_fp16"), finite=False)
        shards = bw / float(hardware["mem_bandwidth_gbs"])  # GPUs working in parallel on one step
        out["decode_ceiling_aggregate_tok_s"] = aggregate_ceiling(
            bw, w, int(c), peak * min(shards, gpus) if peak else None, number(row.get("n_params"), finite=False))
    if out["decode_tok_s"] != "":
        out["decode_efficiency_pct"] = 100.0 * out["decode_tok_s"] / ceil
    return out
