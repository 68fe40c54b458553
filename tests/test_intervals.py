"""The percentile intervals cover the true percentile as often as they claim, at the cell sizes bakeoff runs.

Known truths: lognormal(0, 0.5) (a latency's shape) and a bimodal mixture (a fast path and a slow one, as
with prefix hits and misses), whose quantiles are solved from their CDFs. An interval too narrow covers
less than 93 % of 500 cases; one that reported a number where no rank exists would be caught by the
open-ended checks.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest

from bakeoff.loadgen.metrics import RequestRecord, summarize
from bakeoff.loadgen.orderstats import binom_cdf, binom_cdfs, percentile_interval, rank_interval, share_upper_bound

Z99 = 2.3263478740408408


def _normal_cdf(x: float, mu: float, sd: float) -> float:
    return 0.5 * (1.0 + math.erf((x - mu) / (sd * math.sqrt(2.0))))


def _bimodal_cdf(x: float) -> float:
    return 0.8 * _normal_cdf(x, 1.0, 0.1) + 0.2 * _normal_cdf(x, 3.0, 0.3)


def _solve(cdf: Callable[[float], float], p: float) -> float:
    lo, hi = -10.0, 10.0
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) < p else (lo, mid)
    return lo


DISTS: dict[str, tuple[Callable[[np.random.Generator, int], np.ndarray], Callable[[float], float]]] = {
    "lognormal": (lambda rng, n: rng.lognormal(0.0, 0.5, n), lambda q: math.exp(0.5 * (Z99 if q == 99 else 0.0))),
    "bimodal": (lambda rng, n: np.where(rng.random(n) < 0.8, rng.normal(1.0, 0.1, n), rng.normal(3.0, 0.3, n)),
                lambda q: _solve(_bimodal_cdf, q / 100.0)),
}


@pytest.mark.parametrize("dist", sorted(DISTS))
@pytest.mark.parametrize("n", [30, 100, 400])
@pytest.mark.parametrize("q", [50.0, 99.0])
def test_each_interval_covers_in_at_least_93_percent_of_500_cases_or_is_open(dist: str, n: int, q: float) -> None:
    draw, quantile = DISTS[dist]
    truth = quantile(q)
    rng = np.random.default_rng(7)
    hits = opened = 0
    for _ in range(500):
        sample = draw(rng, n)
        lo, hi = percentile_interval(sample, q)
        assert lo is not None  # a lower rank exists at every size the project runs
        if hi is None:
            opened += 1
        else:
            assert lo <= np.percentile(sample, q) <= hi
        hits += lo <= truth and (hi is None or truth <= hi)
    assert hits / 500 >= 0.93, (dist, n, q, hits)
    # the p99's upper end needs about 300 requests: open below, a number from there on; the median always closes
    assert opened == (500 if q == 99.0 and n < 299 else 0)


def test_ranks_are_the_binomial_ones() -> None:
    assert rank_interval(30, 0.5) == (10, 21)
    assert rank_interval(30, 0.99) == (29, None)  # one-sided at the full level where the top cannot close
    assert rank_interval(298, 0.99)[1] is None and rank_interval(400, 0.99) == (392, 400)
    lo, hi = rank_interval(100, 0.5)
    assert binom_cdf(hi - 1, 100, 0.5) - binom_cdf(lo - 1, 100, 0.5) >= 0.95
    assert binom_cdf(5, 10, 0.5) == pytest.approx(sum(math.comb(10, k) for k in range(6)) / 1024)


def test_the_share_bound_is_clopper_pearson() -> None:
    assert share_upper_bound(0, 50) == pytest.approx(1 - 0.05 ** (1 / 50))  # the rule of three's exact form
    ub = share_upper_bound(3, 100)
    assert binom_cdf(3, 100, ub) == pytest.approx(0.05, abs=1e-6)
    assert share_upper_bound(0, 0) is None and share_upper_bound(5, 5) == 1.0


@pytest.mark.parametrize("n", [30, 100])
@pytest.mark.parametrize("share", [0.01, 0.05, 0.2])
def test_the_share_bound_covers_the_true_share_in_at_least_95_percent_of_500_probes(n: int, share: float) -> None:
    """A probe's requests over a bound at a known true share, at probe lengths the search runs (30, 100): the
    one-sided upper bound is at or above that share in at least 95 % of all outcomes (exact, from the binomial
    probabilities), and in at least 93 % of 500 simulated probes (the floor leaves room for 500 draws' noise)."""
    pmf = np.diff(binom_cdfs(n, share), prepend=0.0)
    assert sum(pmf[k] for k in range(n + 1) if share_upper_bound(k, n) >= share) >= 0.95
    over = np.random.default_rng(n * 1000 + int(share * 1000)).binomial(n, share, size=500)
    covered = sum(share_upper_bound(int(k), n) >= share for k in over)
    assert covered / 500 >= 0.93, covered


def test_every_cell_carries_its_intervals_and_an_open_p99_end_is_empty() -> None:
    rng = np.random.default_rng(0)
    recs = []
    for i in range(40):
        itl = list(rng.uniform(0.01, 0.03, size=15))
        ttft = float(rng.uniform(0.1, 0.3))
        recs.append(RequestRecord(i, 32, 16, start=0.1 * i, success=True, ttft=ttft, e2el=ttft + sum(itl), itl=itl,
                                  output_tokens=16))
    m = summarize(recs, 10.0)
    for metric in ("ttft", "tpot", "itl"):
        lo, hi = m[f"median_{metric}_ms_ci_lo"], m[f"median_{metric}_ms_ci_hi"]
        assert lo <= m[f"median_{metric}_ms"] <= hi and lo < hi, metric
        # 40 requests cannot bound a p99 from above, even with 600 inter-token gaps among them
        assert m[f"p99_{metric}_ms_ci_lo"] <= m[f"p99_{metric}_ms"] and m[f"p99_{metric}_ms_ci_hi"] is None, metric


def test_a_cell_records_its_share_over_each_bound_and_its_peak_in_flight() -> None:
    def rec(i: int, start: float, ttft: float, e2el: float) -> RequestRecord:
        return RequestRecord(i, 8, 5, start=start, success=True, ttft=ttft, e2el=e2el, output_tokens=5)

    # 20 requests: 2 over the TTFT bound (300 ms), 1 over TPOT (50 ms); at most 3 in flight at once
    recs = [rec(i, 0.1 * i, 0.1, 0.1 + 4 * 0.02) for i in range(17)]
    recs += [rec(17, 1.7, 0.5, 0.58), rec(18, 1.8, 0.4, 0.48), rec(19, 1.9, 0.1, 0.1 + 4 * 0.06)]
    m = summarize(recs, 3.0, {"ttft": 300.0, "tpot": 50.0})
    assert m["over_ttft_share"] == pytest.approx(2 / 20) and m["over_tpot_share"] == pytest.approx(1 / 20)
    assert m["over_ttft_share_ub95"] == pytest.approx(share_upper_bound(2, 20))
    assert m["over_tpot_share_ub95"] == pytest.approx(share_upper_bound(1, 20)) and m["over_tpot_share_ub95"] > 0.05
    assert m["peak_in_flight"] == 3  # 17 (1.70-2.28), 18 (1.80-2.28), 19 (1.90-2.24)
    assert "over_ttft_share" not in summarize(recs, 3.0)  # no SLO, no share
