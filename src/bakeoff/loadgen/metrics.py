"""The metric definitions. Every number bakeoff reports for a load cell comes from here.

They follow vLLM's ``vllm bench serve`` (benchmarks/serve.py), so numbers are
comparable with that tool and across engines:

* **TTFT** -- time to first token: from sending the request to the first
  streamed chunk that carries ``choices`` (its text may be empty, as for a
  special token; vLLM's rule).
* **TPOT** -- time per output token, per request, excluding the first token:
  ``(E2EL - TTFT) / (output_tokens - 1)``; requests with one output token
  have none.
* **ITL** -- inter-token latency: the gaps between successive token chunks,
  pooled across all requests (a chunk may carry several tokens; like vLLM we
  measure chunk gaps).
* **E2EL** -- end-to-end latency of a request, send to its last token chunk
  (vLLM's ``latency``; the usage-only chunk and ``[DONE]`` after it are not counted).
* **Token counts** -- from the server's ``usage`` (``stream_options.include_usage``);
  the client tokenizer only when the server sends no usage.
* **Duration** -- first dispatch to last completion of the measured requests
  (warm-up excluded).
* **Throughput** -- completed requests / duration, output tokens / duration,
  (input + output) tokens / duration.
* **Statistics** -- mean, median, std, p90, p99 (numpy, linear percentiles),
  reported in milliseconds with flat keys such as ``median_ttft_ms``.
* **Goodput** -- requests per second that meet every configured SLO
  (``{"ttft": ms, "tpot": ms, "e2el": ms}``), as in ``--goodput``.
* **Server TPOT** -- ``server_median_tpot_ms``: the median over requests of
  the server's own per-token generation time, where the server reports it
  (llama-server's ``timings.predicted_per_token_ms`` in the final chunk). It
  excludes the client, the network and the HTTP stack, so beside the client's
  TPOT it shows how much of a token's time the serving path adds.
* **Failed requests** -- counted with their error strings and excluded from
  every latency statistic and from throughput.

Beside vLLM's definitions, bakeoff's own steady-state view of a closed loop at
concurrency ``c`` with ``N`` measured requests (:func:`steady_state`):

* **Steady span** -- from the moment ``c`` requests are first in flight (the
  ``c``-th dispatch) to the moment fewer than ``c`` requests remain unfinished
  (the ``(N - c + 1)``-th completion): while it lasts every slot holds a
  request, since a closed loop refills a slot as soon as it frees.
* **steady_output_throughput** -- output tokens streamed inside the steady
  span, over its length. A request's tokens are placed at its chunks' arrival
  times (first chunk at TTFT, then the ITL gaps), a chunk of several tokens
  counting ``output_tokens / chunks`` each.
* **ramp_s** -- first dispatch to the span's start; **tail_s** -- the span's
  end to the last completion, when fewer than ``c`` requests run;
  **tail_share** -- ``tail_s / duration``.

Fewer than ``c`` successful requests have no steady span (``None``).

**The start** (bakeoff.loadgen.cellload). A ramped closed loop marks each request sent, or due, before its ramp
ended (``RequestRecord.ramp``). Its latency statistics -- the TTFT, TPOT, ITL and E2EL statistics, their
intervals, the shares over the SLO's bounds and the server's medians -- are taken over the requests after the
ramp, so a verdict reads a served population, not a synchronized first wave; ``p99_ttft_ms_whole_cell`` keeps
the whole cell's TTFT beside them. Counts, throughput, goodput and the steady span above stay the whole cell's.
A burst marks no request, so its statistics are every request's, as in ``vllm bench serve``. Every cell says
how it started: ``load_start`` (``burst``/``ramp``), ``load_ramp_s`` (the ramp's length, 0 for a burst) and
``steady_requests`` (the completed requests its latency statistics read).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import numpy as np

from bakeoff.loadgen.dependence import dependence
from bakeoff.loadgen.orderstats import percentile_interval, share_upper_bound

PERCENTILES = (90, 99)
STAT_METRICS = ("ttft", "tpot", "itl", "e2el")
THROUGHPUT_METRICS = ("output_throughput", "request_throughput", "total_token_throughput", "duration_s")
SERVER_TPOT, SERVER_PROMPT = "server_median_tpot_ms", "server_median_prompt_ms"
SERVER_METRICS = (SERVER_TPOT, SERVER_PROMPT)
GOODPUT = "request_goodput"
PEAK_IN_FLIGHT = "peak_in_flight"
STEADY_METRICS = ("steady_output_throughput", "ramp_s", "tail_s", "tail_share")
# How the cell's load started (module docstring: the start); the whole-cell TTFT only where it ramped.
START_METRICS = ("load_start", "load_ramp_s", "steady_requests", "p99_ttft_ms_whole_cell", "mean_ttft_ms_whole_cell")
# 95 % order-statistic intervals (bakeoff.loadgen.orderstats) of these statistics of these latencies.
CI_STATS = {"median": 50.0, "p99": 99.0}


def ci_key(stat: str, metric: str, end: str) -> str:
    """The column of one end of an interval: ``p99_ttft_ms_ci_lo``; empty where that end is open."""
    return f"{stat}_{metric}_ms_ci_{end}"


CI_METRICS = tuple(ci_key(s, m, end) for m in ("ttft", "tpot", "itl") for s in CI_STATS for end in ("lo", "hi"))


def stat_key(stat: str, metric: str) -> str:
    """The flat key of one statistic of one latency metric, in milliseconds: ``median_ttft_ms``."""
    return f"{stat}_{metric}_ms"


# What a summary row carries of each cell's metrics, in the summary's column order: throughput, the median
# and p99 of every latency, the two means vLLM prints first, goodput. The summary's columns start from this.
SUMMARY_METRICS = (*THROUGHPUT_METRICS, *(stat_key(s, m) for m in STAT_METRICS for s in ("median", "p99")),
                   stat_key("mean", "ttft"), stat_key("mean", "tpot"), GOODPUT, *STEADY_METRICS, *CI_METRICS)


@dataclass
class RequestRecord:
    """One request as the client saw it. Times are seconds; ``start`` is relative to the cell's t0."""

    index: int
    prompt_len: int
    output_len: int  # requested max_tokens
    start: float = 0.0
    success: bool = False
    ttft: float = 0.0
    e2el: float = 0.0
    itl: list[float] = field(default_factory=list)
    prompt_tokens: int | None = None  # server-reported
    output_tokens: int = 0  # server-reported when available
    tokens_from: str = "usage"  # "usage", "client-tokenizer", or "none" (no usage, not counted yet)
    error: str = ""
    generated_text: str = ""
    # The server's own timing of this request, where it reports one (llama-server's final-chunk `timings`).
    server_tpot_ms: float | None = None
    server_prompt_ms: float | None = None
    # The client's side of the request: which of its worker processes sent it, how late it was sent against
    # its intended time (seconds; bakeoff.loadgen.workers says what "intended" is in each loop), and whether
    # it was sent again on a fresh connection (bakeoff.loadgen.client).
    worker: int = 0
    schedule_delay: float | None = None
    done: float | None = None  # when the response ended (its last byte read), on the cell's clock
    retried: bool = False
    ramp: bool = False  # sent, or due, before a ramped start ended: outside the latency statistics

    # The raw stream (reads, their arrival times, the send time) of a request whose decoding was deferred past
    # the measured window (bakeoff.loadgen.client.finish_deferred); never written out.
    raw: tuple[list[bytes], list[float], float] | None = field(default=None, repr=False, compare=False)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("raw", None)
        return out

    @classmethod
    def from_json(cls, row: dict[str, Any]) -> RequestRecord:
        """A record back from one JSONL row (keys it does not know are left out; missing ones take defaults)."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in row.items() if k in known})

    @property
    def tpot(self) -> float | None:
        if self.output_tokens > 1:
            return (self.e2el - self.ttft) / (self.output_tokens - 1)
        return None


def _stats(name: str, values_s: list[float]) -> dict[str, float]:
    arr = np.asarray(values_s, dtype=float) * 1000.0
    stats = {"mean": np.mean, "median": np.median, "std": np.std, **{f"p{p}": (lambda a, p=p: np.percentile(a, p))
                                                                  for p in PERCENTILES}}
    return {stat_key(k, name): float(f(arr)) if arr.size else float("nan") for k, f in stats.items()}


def steady_state(records: list[RequestRecord], concurrency: int) -> dict[str, float | None]:
    """The steady span of one cell and its output throughput (definitions in the module docstring)."""
    ok = sorted((r for r in records if r.success), key=lambda r: r.start)
    none: dict[str, float | None] = dict.fromkeys(STEADY_METRICS)
    if concurrency < 1 or len(ok) < concurrency:
        return none
    first = ok[0].start
    span_start = ok[concurrency - 1].start
    ends = sorted(r.start + r.e2el for r in ok)
    span_end = ends[len(ok) - concurrency]  # the (N - c + 1)-th completion
    last = ends[-1]
    tokens = 0.0
    for r in ok:
        t = r.start + r.ttft + np.concatenate(([0.0], np.cumsum(r.itl)))
        per_chunk = r.output_tokens / len(t)
        tokens += per_chunk * int(np.count_nonzero((t >= span_start) & (t <= span_end)))
    span = span_end - span_start
    duration = last - first
    return {"steady_output_throughput": tokens / span if span > 0 else None,
            "ramp_s": span_start - first, "tail_s": last - span_end,
            "tail_share": (last - span_end) / duration if duration > 0 else None}


def over_shares(ok: list[RequestRecord], slos_ms: dict[str, float]) -> dict[str, float | None]:
    """Per bound: the share of completed requests over it, and a one-sided 95 % upper bound on the true share."""
    out: dict[str, float | None] = {}
    for k, bound in slos_ms.items():
        n_over = sum(1000.0 * v > bound for r in ok
                     if (v := {"ttft": r.ttft, "tpot": r.tpot, "e2el": r.e2el}.get(k)) is not None)
        out[f"over_{k}_share"] = n_over / len(ok) if ok else None
        out[f"over_{k}_share_ub95"] = share_upper_bound(n_over, len(ok))
    return out


def peak_in_flight(records: list[RequestRecord]) -> int:
    """The most measured requests in flight at once (an open-loop cell's real concurrency)."""
    events = sorted([(r.start, 1) for r in records] + [(r.start + r.e2el, -1) for r in records],
                    key=lambda e: (e[0], e[1]))
    peak = now = 0
    for _, step in events:
        now += step
        peak = max(peak, now)
    return peak


def summarize(records: list[RequestRecord], duration_s: float, slos_ms: dict[str, float] | None = None,
              concurrency: int | None = None, *, start: str = "burst", ramp_s: float = 0.0) -> dict[str, Any]:
    """Flat metric dict for one cell (keys as in ``vllm bench serve``; the steady span where ``concurrency`` is given).

    ``start``/``ramp_s``: how the load started (bakeoff.loadgen.runner.CellResult's); the latency statistics leave
    out the requests marked as the ramp's whatever they say (module docstring: the start)."""
    completed = [r for r in records if r.success]
    ok = [r for r in completed if not r.ramp]  # what the latency statistics read: every request of a burst
    failed = [r for r in records if not r.success]
    out_tokens = sum(r.output_tokens for r in completed)
    in_tokens = sum(r.prompt_tokens if r.prompt_tokens is not None else r.prompt_len for r in completed)
    per = {
        "ttft": [r.ttft for r in ok],
        "tpot": [t for r in ok if (t := r.tpot) is not None],
        "itl": [g for r in ok for g in r.itl],
        "e2el": [r.e2el for r in ok],
    }
    res: dict[str, Any] = {
        "num_requests": len(records),
        "completed": len(completed),
        "failed": len(failed),
        "errors": dict(Counter(r.error for r in failed)),
        "duration_s": duration_s,
        "total_input_tokens": in_tokens,
        "total_output_tokens": out_tokens,
        "request_throughput": len(completed) / duration_s if duration_s > 0 else float("nan"),
        "output_throughput": out_tokens / duration_s if duration_s > 0 else float("nan"),
        "total_token_throughput": (in_tokens + out_tokens) / duration_s if duration_s > 0 else float("nan"),
        "tokens_from_usage": all(r.tokens_from == "usage" for r in completed),
    }
    for name in STAT_METRICS:
        res.update(_stats(name, per[name]))
    # One value a request for TTFT and TPOT; a request's inter-token gaps are not independent of each other,
    # so their ranks are sized by the number of requests (conservative), read off the pooled gaps.
    by_request = {"ttft": (per["ttft"], None), "tpot": (per["tpot"], None), "itl": (per["itl"], len(ok))}
    for name, (values, eff_n) in by_request.items():
        for stat, q in CI_STATS.items():
            ci = percentile_interval(values, q, effective_n=eff_n)
            lo, hi = (None, None) if ci is None else ci
            res[ci_key(stat, name, "lo")] = None if lo is None else 1000.0 * lo
            res[ci_key(stat, name, "hi")] = None if hi is None else 1000.0 * hi
    server_tpot = [r.server_tpot_ms for r in ok if r.server_tpot_ms is not None]
    server_prompt = [r.server_prompt_ms for r in ok if r.server_prompt_ms is not None]
    res[SERVER_TPOT] = float(np.median(server_tpot)) if server_tpot else None
    res[SERVER_PROMPT] = float(np.median(server_prompt)) if server_prompt else None
    if slos_ms:
        good = 0
        for r in completed:
            # as vLLM: a request with a single output token has TPOT 0 for goodput
            values = {"ttft": r.ttft, "tpot": r.tpot or 0.0, "e2el": r.e2el}
            if all(values[k] * 1000.0 <= v for k, v in slos_ms.items()):
                good += 1
        res[GOODPUT] = good / duration_s if duration_s > 0 else float("nan")
        res.update(over_shares(ok, slos_ms))
    res.update(dependence(ok))  # whether the 95 % bounds above (shares, intervals) may be read as such
    res[PEAK_IN_FLIGHT] = peak_in_flight(records)
    if concurrency is not None:
        res.update(steady_state(records, concurrency))
    ramped = start == "ramp" or len(ok) < len(completed)
    res.update(load_start="ramp" if ramped else "burst", load_ramp_s=float(ramp_s), steady_requests=len(ok))
    if ramped:  # the server's own timing (bakeoff.loadgen.server_latency) covers the whole window: this is its peer
        whole = _stats("ttft", [r.ttft for r in completed])
        res["p99_ttft_ms_whole_cell"] = whole[stat_key("p99", "ttft")]
        res["mean_ttft_ms_whole_cell"] = whole[stat_key("mean", "ttft")]
    return res
