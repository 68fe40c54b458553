"""Whether a cell's requests were independent enough for the confident rule's 95 % to mean what it says.

Why: the confident rule (bakeoff.loadgen.capacity) bounds the share of requests over a latency bound with a
binomial (Clopper-Pearson) bound, which holds for independent requests. A server's latencies are not always that:
on an H100 (runs/h100-capacity-steady-2026-12-07) the TTFT of consecutive requests of a capacity probe moved
together, with a lag-1 autocorrelation of its logarithm between 0.41 and 0.99 over the steady span, in episodes
of hundreds of milliseconds of higher TTFT that came and went. Requests over a bound then come in clusters, and a
probe of a few hundred requests sees one or two episodes, or none. Simulated at the probes' sizes
(tests/test_dependence.py: a stationary AR(1) log-latency whose true share over the bound is 2 %, twice what a
p99 allows), the confident rule passes at most 1 % of independent probes, but at least 40 % (300 requests) and
30 % (600) of probes whose lag-1 autocorrelation is 0.98: not the at most 5 % it states.

What is measured: the lag-1 autocorrelation of the log TTFT and of the log TPOT of the requests the latency
statistics read, in the order sent (``ttft_lag1_autocorr``, ``tpot_lag1_autocorr``), and from the larger, the
effective number of independent requests, ``n (1 - r) / (1 + r)`` (an AR(1) process's variance of the mean;
``effective_requests``). ``confident_claim_holds`` says whether a 95 % claim may stand: false where even a lower
bound on ``r`` (``r - 1.96 / sqrt(n)``, from the autocorrelation's standard error under independence: one-sided
97.5 % for each of the two series, so 95 % for both together) leaves fewer effective requests than the confident
rule's fewest, 299. So independent requests keep the claim at least 95 % of the time, and an autocorrelation like
the H100's loses it.

The verdict itself is not changed: a probe that passes the confident rule with the claim lost passes as the
point rule would have it, and the record says so. Demanding 299 effective requests would take about 5,700
requests at r = 0.9, several minutes a probe.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from bakeoff.loadgen.orderstats import MIN_CONFIDENT_REQUESTS

MIN_REQUESTS = 30  # fewer: no autocorrelation is estimated
Z = 1.96  # one-sided 97.5 % normal quantile: each of the two autocorrelations, so both at 95 % together
COLUMNS = ["ttft_lag1_autocorr", "tpot_lag1_autocorr", "effective_requests", "confident_claim_holds"]


class Timed(Protocol):
    """What is read of a request (bakeoff.loadgen.metrics.RequestRecord)."""

    success: bool
    start: float
    ttft: float

    @property
    def tpot(self) -> float | None: ...


def lag1(values: Sequence[float]) -> float | None:
    """The lag-1 autocorrelation of ``values`` in order (None where it is undefined: too few, or constant)."""
    x = np.asarray(values, dtype=float)
    if x.size < MIN_REQUESTS or not np.all(np.isfinite(x)):
        return None
    a, b = x[:-1] - x.mean(), x[1:] - x.mean()
    denom = float(np.sum((x - x.mean()) ** 2))
    return float(np.sum(a * b) / denom) if denom > 0 else None


def effective(n: int, r: float) -> float:
    """Independent requests that ``n`` with lag-1 autocorrelation ``r`` are worth (an AR(1)'s variance of the
    mean); no more than ``n``."""
    r = min(max(r, -0.99), 0.999)
    return n * (1.0 - r) / (1.0 + r) if r > 0 else float(n)


def dependence(records: Sequence[Timed], min_effective: int = MIN_CONFIDENT_REQUESTS) -> dict[str, Any]:
    """The columns (``COLUMNS``) for the requests a cell's latency statistics read (``records``: completed, in any
    order; sorted by their send time here). ``min_effective``: the fewest effective requests a 95 % claim needs."""
    ok = sorted((r for r in records if r.success and r.ttft > 0), key=lambda r: r.start)
    n = len(ok)
    ttft = lag1([math.log(r.ttft) for r in ok])
    tpots = [r.tpot for r in ok]
    tpot = lag1([math.log(t) for t in tpots if t]) if all(tpots) else None
    known = [r for r in (ttft, tpot) if r is not None]
    if not known:
        return {"ttft_lag1_autocorr": ttft, "tpot_lag1_autocorr": tpot, "effective_requests": None,
                "confident_claim_holds": None}
    r = max(known)
    lower = r - Z / math.sqrt(n)
    return {"ttft_lag1_autocorr": ttft, "tpot_lag1_autocorr": tpot, "effective_requests": effective(n, r),
            "confident_claim_holds": effective(n, lower) >= min_effective}
