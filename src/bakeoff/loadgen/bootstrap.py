"""Confidence intervals of a cell's latency percentiles, from its own requests (a seeded bootstrap).

Why: one run of a cell has no repeats to spread over, yet its median and p99 are
estimates from a finite set of requests; a p99 of 30 requests is nearly their
maximum. Resampling the cell's requests (with replacement) says how far such an
estimate could move. Whole requests are resampled, so a request's inter-token
gaps stay together (they are not independent of each other). The interval is the
percentile interval of ``RESAMPLES`` resamples with a fixed seed: the same records
always give the same interval. Throughput has no per-request form; its spread
comes from repeats only.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

RESAMPLES = 1000  # bounded: a cell's intervals cost well under a second
SEED = 0
LEVEL = 0.95
STATS = {"median": 50.0, "p99": 99.0}


def ci_key(stat: str, metric: str, end: str) -> str:
    """The column of one end of an interval: ``p99_ttft_ms_ci_lo``."""
    return f"{stat}_{metric}_ms_ci_{end}"


def percentile_ci(groups: Sequence[Sequence[float]], q: float, resamples: int = RESAMPLES, seed: int = SEED,
                  level: float = LEVEL) -> tuple[float, float] | None:
    """The ``level`` interval of the ``q``-th percentile of all values, resampling ``groups`` (one per request).

    None when there is nothing to resample.
    """
    arrays = [np.asarray(g, dtype=float) for g in groups if len(g)]
    if not arrays:
        return None
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(arrays), size=(resamples, len(arrays)))
    if all(a.size == 1 for a in arrays):  # one value a request (TTFT, TPOT): all resamples at once
        flat = np.concatenate(arrays)
        estimates = np.percentile(flat[picks], q, axis=1)
    else:
        estimates = np.array([np.percentile(np.concatenate([arrays[i] for i in row]), q) for row in picks])
    alpha = (1.0 - level) / 2.0
    lo, hi = np.quantile(estimates, [alpha, 1.0 - alpha])
    return float(lo), float(hi)
