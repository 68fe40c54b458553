"""Traces in the Mooncake format: read, drawn from published statistics, turned into token prompts, summarized.

A trace is a JSONL file, one request a line (kvcache-ai/Mooncake, FAST25-release/README.md)::

    {"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, ..., 2354]}

``timestamp`` is the arrival in milliseconds from the trace's start, ``input_length`` and ``output_length``
are token counts, and ``hash_ids`` name the prompt's blocks of ``block_tokens`` tokens (512 in Mooncake's
traces): two requests whose ``hash_ids`` share a prefix share that many blocks of prompt. The rules here:

* **Blocks to tokens.** Block ``h`` is ``block_tokens`` token ids drawn from the model's vocabulary (special
  tokens left out) by a generator seeded with ``(seed, h)``: the same ``h`` gives the same tokens in every
  request, process and run, and two different ids give different tokens. A request's prompt is its blocks in
  order, cut to ``input_length`` tokens. Prompts are sent as token ids, so the server sees exactly these
  tokens (no text round trip can merge tokens across a block boundary) and the trace's prefix reuse reaches it.
* **Lengths.** ``len(hash_ids)`` must be ``ceil(input_length / block_tokens)``, as in Mooncake's traces: a
  line that disagrees is refused, naming it.
* **Order and arrivals.** Requests keep the file's order, and timestamps may not decrease. Request ``i`` is
  sent ``(timestamp_i - timestamp_0) / 1000 x time_scale`` seconds after the cell's start (bakeoff.loadgen.workers
  records how late each was actually sent, its schedule delay).
* **Implied hit rate.** What a prefix cache without limit would reuse: for each request, the leading blocks
  whose whole prefix an earlier request already had, in tokens (at most its ``input_length``), summed over
  the trace and divided by all its prompt tokens.
* **The generator** draws a trace of any size from a trace's statistics (data/traces/*.yaml, each citing its
  source; :func:`trace_stats` computes them from a trace file): bursts of a Poisson number of requests on a
  fixed tick, input and output lengths by inverse CDF over published percentiles (linear between them) times
  ``length_scale``, every request opening with the shared root block(s), and a ``continuation_share`` of
  requests continuing a uniformly chosen earlier request: they share a fraction of its blocks drawn from the
  statistics' percentiles (at least the root, always leaving the request one block of its own).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from bakeoff.errors import BakeoffError

KEYS = ("timestamp", "input_length", "output_length", "hash_ids")


@dataclass(frozen=True)
class TraceRequest:
    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        return {"timestamp": self.timestamp_ms, "input_length": self.input_length,
                "output_length": self.output_length, "hash_ids": list(self.hash_ids)}


def parse(lines: Iterable[str], block_tokens: int, source: str = "trace") -> list[TraceRequest]:
    """The requests of a Mooncake-format trace, checked line by line (errors name the line)."""
    out: list[TraceRequest] = []
    for no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise BakeoffError(f"{source}:{no}: not JSON ({e})") from None
        missing = [k for k in KEYS if k not in row] if isinstance(row, dict) else list(KEYS)
        if missing:
            raise BakeoffError(f"{source}:{no}: missing {missing} (a Mooncake trace line has {list(KEYS)})")
        ids, n_in, n_out = row["hash_ids"], row["input_length"], row["output_length"]
        if not (isinstance(n_in, int) and n_in >= 1 and isinstance(n_out, int) and n_out >= 1):
            raise BakeoffError(f"{source}:{no}: input_length and output_length must be integers >= 1, "
                               f"got {n_in!r}, {n_out!r}")
        if not (isinstance(ids, list) and all(isinstance(h, int) for h in ids)):
            raise BakeoffError(f"{source}:{no}: hash_ids must be a list of integers")
        if len(ids) != math.ceil(n_in / block_tokens):
            raise BakeoffError(f"{source}:{no}: {len(ids)} hash_ids for input_length {n_in}: blocks of "
                               f"{block_tokens} tokens need {math.ceil(n_in / block_tokens)} (trace.block_tokens)")
        ts = float(row["timestamp"])
        if out and ts < out[-1].timestamp_ms:
            raise BakeoffError(f"{source}:{no}: timestamp {ts:g} is before the previous line's "
                               f"{out[-1].timestamp_ms:g}: a trace is replayed in its own order")
        out.append(TraceRequest(ts, n_in, n_out, tuple(ids)))
    if not out:
        raise BakeoffError(f"{source}: no requests")
    return out


def read(path: Path, block_tokens: int) -> list[TraceRequest]:
    try:
        text = path.read_text()
    except OSError as e:
        raise BakeoffError(f"trace {path}: cannot be read ({e.strerror})") from None
    return parse(text.splitlines(), block_tokens, str(path))


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def offsets(rows: Sequence[TraceRequest], time_scale: float) -> list[float]:
    """Each request's send time in seconds from the cell's start: its timestamp from the first, x ``time_scale``."""
    t0 = rows[0].timestamp_ms
    return [(r.timestamp_ms - t0) / 1000.0 * time_scale for r in rows]


def natural_rate(rows: Sequence[TraceRequest]) -> float | None:
    """The trace's mean request rate (req/s) at ``time_scale`` 1: requests after the first over its span."""
    span = (rows[-1].timestamp_ms - rows[0].timestamp_ms) / 1000.0
    return (len(rows) - 1) / span if span > 0 and len(rows) > 1 else None


def block_tokens_of(hash_id: int, block_tokens: int, vocab: np.ndarray, seed: int) -> list[int]:
    """The token ids of block ``hash_id`` (module docstring: the same id, the same tokens)."""
    rng = np.random.default_rng([seed, hash_id & 0xFFFFFFFFFFFFFFFF])
    return rng.choice(vocab, size=block_tokens).tolist()


def prompt_ids(row: TraceRequest, block_tokens: int, vocab: np.ndarray, seed: int,
               cache: dict[int, list[int]] | None = None) -> list[int]:
    """A request's prompt: its blocks' tokens in order, cut to its ``input_length``."""
    cache = {} if cache is None else cache
    ids: list[int] = []
    for h in row.hash_ids:
        if h not in cache:
            cache[h] = block_tokens_of(h, block_tokens, vocab, seed)
        ids += cache[h]
    return ids[:row.input_length]


def implied_hits(rows: Sequence[TraceRequest], block_tokens: int) -> tuple[int, int]:
    """(prompt tokens a cache without limit would reuse, all prompt tokens): module docstring."""
    seen: set[tuple[int, ...]] = set()
    hit = total = 0
    for r in rows:
        k = 0
        while k < len(r.hash_ids) and r.hash_ids[:k + 1] in seen:
            k += 1
        hit += min(k * block_tokens, r.input_length)
        total += r.input_length
        seen.update(r.hash_ids[:j] for j in range(1, len(r.hash_ids) + 1))
    return hit, total


# --- statistics and the generator ----------------------------------------------------------------------------


def load_stats(path: Path) -> dict[str, Any]:
    try:
        stats = yaml.safe_load(path.read_text())
    except OSError as e:
        raise BakeoffError(f"trace statistics {path}: cannot be read ({e.strerror})") from None
    need = ("source", "block_tokens", "arrival", "new_input_length_quantiles", "output_length_quantiles",
            "root_blocks", "continuation_share", "shared_fraction_quantiles", "new_blocks_quantiles")
    if missing := [k for k in need if k not in (stats or {})]:
        raise BakeoffError(f"trace statistics {path}: missing {missing}")
    return stats


def _inverse_cdf(quantiles: Mapping[Any, float], u: np.ndarray) -> np.ndarray:
    """Values at probabilities ``u`` (0-1), linear between the given percentiles (keys 0..100)."""
    pts = sorted((float(k), float(v)) for k, v in quantiles.items())
    if pts[0][0] != 0.0 or pts[-1][0] != 100.0:
        raise BakeoffError(f"percentiles must run from 0 to 100, got {[p for p, _ in pts]}")
    return np.interp(100.0 * u, [p for p, _ in pts], [v for _, v in pts])


def generate(stats: Mapping[str, Any], requests: int, block_tokens: int, seed: int = 0,
             max_input_len: int | None = None, max_output_len: int | None = None) -> list[TraceRequest]:
    """A trace of ``requests`` requests drawn from ``stats`` (module docstring: the generator's rules)."""
    rng = np.random.default_rng(seed)
    scale = block_tokens / float(stats.get("block_tokens", 512))
    tick, batch = float(stats["arrival"]["tick_s"]), float(stats["arrival"]["batch_mean"])
    times: list[float] = []
    k = 0
    while len(times) < requests:
        times += [1000.0 * tick * k] * int(rng.poisson(batch))
        k += 1
    root = int(stats["root_blocks"])
    next_id = root
    rows: list[TraceRequest] = []
    for i in range(requests):
        if rows and rng.random() < float(stats["continuation_share"]):
            src = rows[int(rng.integers(len(rows)))].hash_ids
            frac = float(_inverse_cdf(stats["shared_fraction_quantiles"], rng.random(1))[0])
            shared = src[:max(root + 1, round(frac * len(src)))]
            new = max(1, round(float(_inverse_cdf(stats["new_blocks_quantiles"], rng.random(1))[0])))
            n_in = (len(shared) + new - 1) * block_tokens + int(rng.integers(1, block_tokens + 1))
        else:
            n_in = max(1, round(float(_inverse_cdf(stats["new_input_length_quantiles"], rng.random(1))[0]) * scale))
            shared = tuple(range(root))[:math.ceil(n_in / block_tokens) - 1]
        if max_input_len:
            n_in = min(n_in, max_input_len)
        n = math.ceil(n_in / block_tokens)
        shared = shared[:n - 1]  # every request has a block of its own
        ids = shared + tuple(range(next_id, next_id + n - len(shared)))
        next_id += n - len(shared)
        n_out = max(1, round(float(_inverse_cdf(stats["output_length_quantiles"], rng.random(1))[0]) * scale))
        rows.append(TraceRequest(times[i], n_in, min(n_out, max_output_len or n_out), ids))
    return rows


def _percentiles(values: Sequence[float], at: Sequence[int]) -> dict[int, float]:
    return {p: float(v) for p, v in zip(at, np.percentile(np.asarray(values, dtype=float), at), strict=True)}


LENGTH_PCTS = (0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 95, 99, 100)


def trace_stats(rows: Sequence[TraceRequest], block_tokens: int) -> dict[str, Any]:
    """The statistics the generator draws from, computed from a trace (data/traces/*.yaml were made so).

    A request's shared blocks are its leading blocks whose prefix an earlier request had; the root is the fewest
    any request after the first shares (a system prompt every request opens with); a request that shares more
    than the root continues the earliest request with that prefix."""
    ts = np.asarray([r.timestamp_ms for r in rows]) / 1000.0
    distinct, counts = np.unique(ts, return_counts=True)
    first: dict[tuple[int, ...], int] = {}
    shared: list[tuple[int, int | None]] = []  # (blocks shared, the request first holding them)
    for i, r in enumerate(rows):
        k = 0
        while k < len(r.hash_ids) and r.hash_ids[:k + 1] in first:
            k += 1
        shared.append((k, first[r.hash_ids[:k]] if k else None))
        for j in range(1, len(r.hash_ids) + 1):
            first.setdefault(r.hash_ids[:j], i)
    root = min((k for k, _ in shared[1:]), default=0)
    fractions: list[float] = []
    new_blocks: list[int] = []
    new_lengths: list[int] = []
    for r, (k, src) in zip(rows, shared, strict=True):
        if k > root and src is not None:
            fractions.append(k / len(rows[src].hash_ids))
            new_blocks.append(len(r.hash_ids) - k)
        else:
            new_lengths.append(r.input_length)
    continued = len(fractions)
    hit, total = implied_hits(rows, block_tokens)
    gaps = np.diff(distinct)
    return {"block_tokens": block_tokens, "requests": len(rows), "duration_s": float(ts[-1] - ts[0]),
            "arrival": {"tick_s": float(np.median(gaps)) if gaps.size else 0.0,
                        "batch_mean": float(counts.mean()),
                        "batch_variance_over_mean": float(counts.var() / counts.mean())},
            "mean_input_length": float(np.mean([r.input_length for r in rows])),
            "mean_output_length": float(np.mean([r.output_length for r in rows])),
            "input_length_quantiles": _percentiles([r.input_length for r in rows], LENGTH_PCTS),
            "output_length_quantiles": _percentiles([r.output_length for r in rows], LENGTH_PCTS),
            "new_input_length_quantiles": _percentiles(new_lengths, LENGTH_PCTS) if new_lengths else {},
            "root_blocks": root, "continuation_share": continued / len(rows),
            "shared_fraction_quantiles": _percentiles(fractions, range(0, 101, 10)) if fractions else {},
            "new_blocks_quantiles": _percentiles(new_blocks, LENGTH_PCTS) if new_blocks else {},
            "implied_hit_rate": hit / total}


def stats_command(a: argparse.Namespace) -> None:
    """``bakeoff trace-stats TRACE``: the statistics the generator draws from, computed from a Mooncake trace."""
    print(json.dumps(trace_stats(read(Path(a.trace), a.block_tokens), a.block_tokens), indent=2))
