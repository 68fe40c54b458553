"""Distribution-free intervals of a percentile, and an upper bound on a share, from binomial ranks.

Why not a bootstrap: a percentile bootstrap cannot reach past the sample's largest value, so the
interval of a p99 from 30 requests (near that maximum) covers the true p99 far less often than it claims.
Order statistics need no model of the latency's shape: with ``n`` independent requests, the chance that
the true ``q``-quantile lies between the ``l``-th and ``u``-th smallest is ``P(l <= B < u)`` with
``B ~ Binomial(n, q)``, so ranks chosen from that distribution give an interval that covers at least as
often as stated, whatever the distribution. Where ``n`` is too small for a rank to exist (the p99's upper
bound needs about 300 requests at 95 %), that end is open: ``None``, never a number.

The ranks' binomial sums are scipy's binomial CDF (the regularized incomplete beta function, accurate
in the far tails the p99's ranks read), the same one the capacity rule's allowance uses. The share's upper
bound is scipy's beta quantile, the Clopper-Pearson bound's closed form (fast enough to run on every cell
and in the capacity rule's simulations).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

LEVEL = 0.95
P99_SHARE = 0.01  # the share of requests a p99 bound allows over it
# The fewest requests with which a 95 % upper bound on a share can be 1 %: none over, 0.99^n <= 0.05 (299), the
# confident rule's minimum (bakeoff.loadgen.capacity) and the effective requests its claim needs
# (bakeoff.loadgen.dependence).
MIN_CONFIDENT_REQUESTS = math.ceil(math.log(1.0 - LEVEL) / math.log1p(-P99_SHARE))


def binom_cdfs(n: int, p: float) -> np.ndarray:
    """``P(B <= k)`` for ``k = 0..n`` and ``B ~ Binomial(n, p)`` (``p`` in [0, 1])."""
    from scipy.stats import binom

    return np.asarray(binom.cdf(np.arange(n + 1), n, p), dtype=float)


def binom_cdf(k: int, n: int, p: float) -> float:
    """``P(B <= k)`` for ``B ~ Binomial(n, p)``."""
    return 0.0 if k < 0 else 1.0 if k >= n else float(binom_cdfs(n, p)[k])


def rank_interval(n: int, q: float, level: float = LEVEL) -> tuple[int | None, int | None]:
    """1-based ranks ``(l, u)`` whose order statistics hold the ``q``-quantile with at least ``level``.

    Equal tails where both ends exist; where one end cannot exist at ``n``, that end is None and the other
    is a one-sided bound at the full ``level``.
    """
    alpha = 1.0 - level
    cdf = binom_cdfs(n, q)  # cdf[k] = P(B <= k)

    def lower(a: float) -> int | None:  # largest l with P(B <= l - 1) <= a, i.e. P(X_(l) > xi) <= a
        ok = np.flatnonzero(cdf[:n] <= a)
        return int(ok[-1]) + 1 if ok.size else None

    def upper(a: float) -> int | None:  # smallest u with P(B <= u - 1) >= 1 - a, i.e. P(X_(u) < xi) <= a
        ok = np.flatnonzero(cdf[:n] >= 1.0 - a)
        return int(ok[0]) + 1 if ok.size else None

    lo, hi = lower(alpha / 2), upper(alpha / 2)
    if lo is None and hi is not None:
        hi = upper(alpha)
    elif hi is None and lo is not None:
        lo = lower(alpha)
    return lo, hi


def percentile_interval(values: Sequence[float], pct: float, level: float = LEVEL,
                        effective_n: int | None = None) -> tuple[float | None, float | None] | None:
    """The ``level`` interval of the ``pct``-th percentile of ``values``; an open end is None.

    ``effective_n`` (fewer than ``len(values)``) sizes the ranks for values that are not independent, e.g.
    inter-token gaps grouped by request: the ranks are those of ``effective_n`` draws, read off the pooled
    values at the same quantile positions. None when there are no values.
    """
    arr = np.sort(np.asarray(values, dtype=float))
    if arr.size == 0:
        return None
    n = effective_n if effective_n is not None and 0 < effective_n < arr.size else arr.size
    lo_rank, hi_rank = rank_interval(n, pct / 100.0, level)

    def at(rank: int | None) -> float | None:
        if rank is None:
            return None
        if n == arr.size:
            return float(arr[rank - 1])
        return float(np.quantile(arr, (rank - 1) / (n - 1) if n > 1 else 0.0, method="linear"))

    return at(lo_rank), at(hi_rank)


def share_upper_bound(k: int, n: int, level: float = LEVEL) -> float | None:
    """One-sided ``level`` upper bound (Clopper-Pearson) on a share seen as ``k`` of ``n``; None when n is 0."""
    from scipy.stats import beta

    if n <= 0:
        return None
    if k >= n:
        return 1.0
    return float(beta.ppf(level, k + 1, n - k))  # the p at which P(B <= k | p) = 1 - level
