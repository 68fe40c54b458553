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
* **Reuse distance.** A request *continues* an earlier one when it shares more than the root block(s) with it;
  the request it continues is the most recent earlier one holding the whole prefix it shares (what a cache
  that keeps recently used blocks sees last), and its reuse distance is how many requests back that one is.
* **The generator** draws a trace of any size from a trace's statistics (data/traces/*.yaml, each citing its
  source; :func:`trace_stats` computes them from a trace file). Arrivals: bursts of a Poisson number of
  requests on a fixed tick, the burst mean times a rate multiplier held for each window of ``window_s`` (mean
  1, gamma-distributed, its spread what is left of the trace's per-window count CV once Poisson noise is taken
  out). Requests: input and output lengths by inverse CDF over published percentiles (linear between them)
  times ``length_scale``; every request opens with the shared root block(s). Conversations: when request ``s``
  is drawn it is, with the chance ``continued_chance`` gives for its kind (opening or continuing), continued
  ``d`` requests later, ``d`` drawn from ``continued_distance_quantiles``; the continuation shares a fraction of
  ``s``'s blocks drawn from the statistics' percentiles (at least the root and one more, always leaving the
  request one block of its own) plus a drawn number of its own. So each request is continued at most once, as
  in Mooncake's trace, and a drawn trace starts cold as the real one does: its first requests open
  conversations, and continuations due past its end are never drawn. Those two distributions are corrected for
  the trace's ends (:func:`trace_stats`), so a trace drawn at the source's size has the source's measured
  continuation share and reuse-distance percentiles (``reuse_distance_quantiles``); a shorter one holds only
  the reuses that fit in it, as a stretch of that length of the real trace would.
"""

from __future__ import annotations

import argparse
import hashlib
import heapq
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
            "root_blocks", "continuation_share", "shared_fraction_quantiles", "new_blocks_quantiles",
            "continued_chance", "continued_distance_quantiles")
    if missing := [k for k in need if k not in (stats or {})]:
        raise BakeoffError(f"trace statistics {path}: missing {missing}")
    return stats


def _points(quantiles: Mapping[Any, float]) -> tuple[np.ndarray, np.ndarray]:
    """(percentiles, values) of a percentile table (keys 0..100), sorted by percentile."""
    pts = sorted((float(k), float(v)) for k, v in quantiles.items())
    if pts[0][0] != 0.0 or pts[-1][0] != 100.0:
        raise BakeoffError(f"percentiles must run from 0 to 100, got {[p for p, _ in pts]}")
    return np.array([p for p, _ in pts]), np.array([v for _, v in pts])


def _inverse_cdf(quantiles: Mapping[Any, float], u: np.ndarray) -> np.ndarray:
    """Values at probabilities ``u`` (0-1), linear between the given percentiles (keys 0..100)."""
    pcts, values = _points(quantiles)
    return np.interp(100.0 * np.asarray(u), pcts, values)


def quantile_cdf(quantiles: Mapping[Any, float], x: float | np.ndarray) -> np.ndarray:
    """The probability (0-1) of a value at most ``x`` under the distribution :func:`_inverse_cdf` draws from
    (the inverse of its piecewise-linear quantile function; at a value several percentiles share, the highest)."""
    pcts, values = _points(quantiles)
    keep = np.append(values[1:] != values[:-1], True)  # of repeated values, the last (highest) percentile
    return np.interp(np.asarray(x, dtype=float), values[keep], pcts[keep]) / 100.0


def rate_multiplier_cv(stats: Mapping[str, Any]) -> float:
    """The spread (CV) of the per-window rate multiplier that gives drawn traces the source's per-window count CV.

    A window of ``n`` ticks with multiplier ``m`` holds a Poisson count of mean ``n x batch_mean x m``, so the
    counts' CV^2 is ``1 / (n x batch_mean) + CV(m)^2``: the Poisson part is taken out of the recorded CV (0 where
    the statistics record none, or less than Poisson noise alone makes)."""
    arrival = stats["arrival"]
    cv, window = arrival.get("window_count_cv"), arrival.get("window_s")
    if not cv or not window:
        return 0.0
    per_window = max(1, round(float(window) / float(arrival["tick_s"]))) * float(arrival["batch_mean"])
    return math.sqrt(max(0.0, float(cv) ** 2 - 1.0 / per_window))


def arrival_times(stats: Mapping[str, Any], requests: int, rng: np.random.Generator) -> np.ndarray:
    """``requests`` arrival times (ms): a Poisson burst on each tick, its mean ``batch_mean`` times a multiplier
    held for each window of ``window_s`` (gamma, mean 1, CV from :func:`rate_multiplier_cv`; none recorded: 1)."""
    tick, batch = float(stats["arrival"]["tick_s"]), float(stats["arrival"]["batch_mean"])
    window = stats["arrival"].get("window_s")
    per = max(1, round(float(window) / tick)) if window else 100
    cv = rate_multiplier_cv(stats)
    counts: list[np.ndarray] = []
    total = 0
    while total < requests:
        m = float(rng.gamma(1.0 / cv**2, cv**2)) if cv > 0 else 1.0
        counts.append(rng.poisson(batch * m, size=per))
        total += int(counts[-1].sum())
    per_tick = np.concatenate(counts)
    return np.repeat(1000.0 * tick * np.arange(per_tick.size), per_tick)[:requests]


def generate(stats: Mapping[str, Any], requests: int, block_tokens: int, seed: int = 0,
             max_input_len: int | None = None, max_output_len: int | None = None) -> list[TraceRequest]:
    """A trace of ``requests`` requests drawn from ``stats`` (module docstring: the generator's rules)."""
    rng = np.random.default_rng(seed)
    scale = block_tokens / float(stats.get("block_tokens", 512))
    times = arrival_times(stats, requests, rng)
    chance = {True: float(stats["continued_chance"]["continuation"]),
              False: float(stats["continued_chance"]["opening"])}
    root = int(stats["root_blocks"])
    next_id = root
    due: list[tuple[int, int]] = []  # (the index a continuation is due at, the request it continues)
    rows: list[TraceRequest] = []
    for i in range(requests):
        if due and due[0][0] <= i:  # two due at once: the later-drawn waits a request
            src = rows[heapq.heappop(due)[1]].hash_ids
            frac = float(_inverse_cdf(stats["shared_fraction_quantiles"], rng.random()))
            shared = src[:max(root + 1, round(frac * len(src)))]
            new = max(1, round(float(_inverse_cdf(stats["new_blocks_quantiles"], rng.random()))))
            n_in = (len(shared) + new - 1) * block_tokens + int(rng.integers(1, block_tokens + 1))
        else:
            n_in = max(1, round(float(_inverse_cdf(stats["new_input_length_quantiles"], rng.random())) * scale))
            shared = tuple(range(root))[:math.ceil(n_in / block_tokens) - 1]
        if max_input_len:
            n_in = min(n_in, max_input_len)
        n = math.ceil(n_in / block_tokens)
        shared = shared[:n - 1]  # every request has a block of its own
        ids = shared + tuple(range(next_id, next_id + n - len(shared)))
        next_id += n - len(shared)
        n_out = max(1, round(float(_inverse_cdf(stats["output_length_quantiles"], rng.random())) * scale))
        rows.append(TraceRequest(float(times[i]), n_in, min(n_out, max_output_len or n_out), ids))
        if rng.random() < chance[len(shared) > root]:
            d = max(1, round(float(_inverse_cdf(stats["continued_distance_quantiles"], rng.random()))))
            heapq.heappush(due, (i + d, i))
    return rows


def _percentiles(values: Sequence[float], at: Sequence[int]) -> dict[int, float]:
    return {p: float(v) for p, v in zip(at, np.percentile(np.asarray(values, dtype=float), at), strict=True)}


def _weighted_percentiles(values: np.ndarray, weights: np.ndarray, at: Sequence[int]) -> dict[int, float]:
    """Percentiles of ``values`` each counted ``weights`` times: the smallest value whose cumulative weight
    reaches the percentile (0: the smallest value)."""
    order = np.argsort(values, kind="stable")
    v, cum = values[order], np.cumsum(weights[order])
    cum /= cum[-1]
    return {p: float(v[0] if p == 0 else v[min(int(np.searchsorted(cum, p / 100.0 - 1e-12)), v.size - 1)])
            for p in at}


LENGTH_PCTS = (0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 95, 99, 100)
REUSE_PCTS = (0, 1, 5, 10, 20, 30, 40, 50, 60, 70, 80, 90, 95, 99, 100)
RATE_WINDOW_S = 300.0  # the window the rate's variation is measured over (issue 45: "per 5 minutes")


def continuations(rows: Sequence[TraceRequest]) -> tuple[int, list[tuple[int, int, int]]]:
    """(root blocks, [(request, the request it continues, blocks shared)]) (module docstring: reuse distance).

    A request's shared blocks are its leading blocks whose prefix an earlier request had; the root is the fewest
    any request after the first shares (a system prompt every request opens with); a request sharing more than
    the root continues the most recent earlier request holding that prefix."""
    last: dict[tuple[int, ...], int] = {}
    shared: list[tuple[int, int | None]] = []
    for i, r in enumerate(rows):
        k = 0
        while k < len(r.hash_ids) and r.hash_ids[:k + 1] in last:
            k += 1
        shared.append((k, last[r.hash_ids[:k]] if k else None))
        for j in range(1, len(r.hash_ids) + 1):
            last[r.hash_ids[:j]] = i
    root = min((k for k, _ in shared[1:]), default=0)
    return root, [(i, src, k) for i, (k, src) in enumerate(shared) if k > root and src is not None]


def reuse_distances(rows: Sequence[TraceRequest]) -> np.ndarray:
    """Each continuation's reuse distance: requests back to the request it continues."""
    return np.array([i - src for i, src, _ in continuations(rows)[1]], dtype=int)


def window_counts(timestamps_ms: Sequence[float] | np.ndarray, window_s: float = RATE_WINDOW_S) -> np.ndarray:
    """Arrivals per whole window of ``window_s`` from the first (a last, partial window left out)."""
    ts = np.asarray(timestamps_ms, dtype=float) / 1000.0
    ts -= ts[0]
    whole = int(ts[-1] // window_s)
    return np.bincount((ts // window_s).astype(int), minlength=whole + 1)[:whole]


def _ends_corrected(rows: Sequence[TraceRequest], conts: Sequence[tuple[int, int, int]]) -> dict[str, Any]:
    """The conversation statistics the generator draws, corrected for the trace's ends.

    A request continued ``d`` requests later is seen as continued only if both lie in the trace: of ``n``
    requests, ``n - d`` could be. So a distance ``d`` counts ``1 / (n - d)`` times in the distances' percentiles,
    and the chance that a request of a kind (opening, continuing) is continued is the continued ones over the sum,
    over requests of that kind at index ``s``, of the chance that the continuation falls in the trace
    (corrected distribution's CDF at ``n - 1 - s``). Without this, a drawn trace, which also starts cold and stops,
    would lose the reuses across its ends twice."""
    n = len(rows)
    d = np.array([i - s for i, s, _ in conts], dtype=float)
    if d.size == 0:
        return {}
    w = 1.0 / (n - d)
    order = np.argsort(d, kind="stable")
    cdf = np.cumsum(w[order]) / w.sum()
    d_sorted = d[order]
    fits = np.searchsorted(d_sorted, n - 1 - np.arange(n), side="right")  # distances that fit after each index
    in_trace = np.where(fits > 0, cdf[np.maximum(fits - 1, 0)], 0.0)
    is_cont = np.zeros(n, dtype=bool)
    is_cont[[i for i, _, _ in conts]] = True
    continued = np.zeros(n, dtype=bool)
    continued[[s for _, s, _ in conts]] = True
    chance = {kind: float(continued[mask].sum() / in_trace[mask].sum()) if in_trace[mask].sum() > 0 else 0.0
              for kind, mask in (("opening", ~is_cont), ("continuation", is_cont))}
    return {"continued_chance": chance, "continued_distance_quantiles": _weighted_percentiles(d, w, REUSE_PCTS)}


def trace_stats(rows: Sequence[TraceRequest], block_tokens: int) -> dict[str, Any]:
    """The statistics the generator draws from, computed from a trace (data/traces/*.yaml were made so).

    Continuations as :func:`continuations` finds them: their shared fraction is of the blocks of the request
    they continue. The rate's variation is the CV of the requests in each whole ``RATE_WINDOW_S`` window."""
    ts = np.asarray([r.timestamp_ms for r in rows]) / 1000.0
    distinct, counts = np.unique(ts, return_counts=True)
    root, conts = continuations(rows)
    continuing = {i for i, _, _ in conts}
    fractions = [k / len(rows[src].hash_ids) for _, src, k in conts]
    new_blocks = [len(rows[i].hash_ids) - k for i, _, k in conts]
    new_lengths = [r.input_length for i, r in enumerate(rows) if i not in continuing]
    distances = [i - src for i, src, _ in conts]
    hit, total = implied_hits(rows, block_tokens)
    gaps = np.diff(distinct)
    windows = window_counts(ts * 1000.0)
    return {"block_tokens": block_tokens, "requests": len(rows), "duration_s": float(ts[-1] - ts[0]),
            "arrival": {"tick_s": float(np.median(gaps)) if gaps.size else 0.0,
                        "batch_mean": float(counts.mean()),
                        "batch_variance_over_mean": float(counts.var() / counts.mean()),
                        "window_s": RATE_WINDOW_S, "windows": int(windows.size),
                        "window_count_cv": float(windows.std() / windows.mean()) if windows.size >= 2 else None,
                        "window_count_range": [int(windows.min()), int(windows.max())] if windows.size else None},
            "mean_input_length": float(np.mean([r.input_length for r in rows])),
            "mean_output_length": float(np.mean([r.output_length for r in rows])),
            "input_length_quantiles": _percentiles([r.input_length for r in rows], LENGTH_PCTS),
            "output_length_quantiles": _percentiles([r.output_length for r in rows], LENGTH_PCTS),
            "new_input_length_quantiles": _percentiles(new_lengths, LENGTH_PCTS) if new_lengths else {},
            "root_blocks": root, "continuation_share": len(conts) / len(rows),
            "shared_fraction_quantiles": _percentiles(fractions, range(0, 101, 10)) if fractions else {},
            "new_blocks_quantiles": _percentiles(new_blocks, LENGTH_PCTS) if new_blocks else {},
            "reuse_distance_quantiles": _percentiles(distances, REUSE_PCTS) if distances else {},
            **_ends_corrected(rows, conts),
            "implied_hit_rate": hit / total}


def stats_command(a: argparse.Namespace) -> None:
    """``bakeoff trace-stats TRACE``: the statistics the generator draws from, computed from a Mooncake trace."""
    print(json.dumps(trace_stats(read(Path(a.trace), a.block_tokens), a.block_tokens), indent=2))
