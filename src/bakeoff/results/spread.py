"""Spread across repeats, and which differences between variants exceed it.

Why: one number per cell cannot say whether a 3 % gap between two formats is
real. With ``load.repeats`` > 1 every (variant, concurrency, prompt length)
group has one value per repeat of each key metric, and repeats after a server
restart (``load.restart_between_repeats``) put restart drift into that spread.

Per group: mean, sample standard deviation, coefficient of variation and the
half-width of the 95 % Student-t interval of the mean (``<metric>_ci95``; the
interval is mean ± that). With few repeats the t quantile is large (12.7 for
2 repeats, 4.3 for 3), which is the honest price of few repeats.

A difference between two variants is *significant* when Welch's t-test on their
per-repeat values gives p < 0.05. Welch, not "non-overlapping 95 % intervals":
non-overlap is a much stricter test than its level suggests (about p < 0.006 for
equal spreads), and Welch does not assume the two variants are equally noisy,
which engines and formats are not. Fewer than two ok repeats on either side
gives no verdict (empty), never "significant".
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bakeoff.layout import variant_name
from bakeoff.results.baselines import SIXTEEN_BITS
from bakeoff.results.numbers import number

KEY_METRICS = ("output_throughput", "median_ttft_ms", "median_tpot_ms", "median_e2el_ms")
STATS = ("mean", "std", "cv_pct", "ci95")
VS_REF = ("vs_ref_pct", "vs_ref_p", "vs_ref_significant")
ALPHA = 0.05
# A group is one cell of the matrix; its rows differ only by repeat.
GROUP_KEY = ("experiment", "model", "engine", "format", "hardware", "concurrency", "prompt_len", "output_len",
             "request_rate")
# The same cell of another variant: everything but engine and format.
CELL_KEY = tuple(k for k in GROUP_KEY if k not in ("engine", "format"))

GROUP_COLUMNS = ["repeats_ok", "repeat_server_starts", *[f"{m}_{s}" for m in KEY_METRICS for s in STATS]]
COMPARE_COLUMNS = ["ref_variant", *[f"{m}_{s}" for m in KEY_METRICS for s in VS_REF]]
COLUMNS = [*GROUP_COLUMNS, *COMPARE_COLUMNS]


@dataclass(frozen=True)
class Spread:
    n: int
    mean: float
    std: float  # sample standard deviation (ddof=1); NaN for one value
    cv_pct: float
    ci95: float  # half-width of the 95 % Student-t interval of the mean; NaN for one value

    def columns(self, metric: str) -> dict[str, float]:
        return {f"{metric}_{s}": getattr(self, s) for s in STATS}


def spread(values: Sequence[float]) -> Spread:
    from scipy import stats

    n = len(values)
    if n == 0:
        return Spread(0, math.nan, math.nan, math.nan, math.nan)
    mean = math.fsum(values) / n
    if n == 1:
        return Spread(1, mean, math.nan, math.nan, math.nan)
    std = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))
    cv = 100.0 * std / abs(mean) if mean else math.nan
    return Spread(n, mean, std, cv, float(stats.t.ppf(0.975, n - 1)) * std / math.sqrt(n))


@dataclass(frozen=True)
class Difference:
    rel_pct: float  # (mean of b - mean of a) / mean of a, in percent
    p: float | None  # Welch's two-sided p-value; None without two values a side
    significant: bool | None  # p < ALPHA; None: no verdict

    @property
    def verdict(self) -> str:
        return {True: "significant", False: "not significant", None: "no verdict (fewer than 2 repeats)"}[self.significant]


def compare(a: Sequence[float], b: Sequence[float], alpha: float = ALPHA) -> Difference:
    """Is ``b`` different from ``a`` beyond the spread of their repeats? (Welch's t-test)."""
    from scipy import stats

    ma, mb = spread(a).mean, spread(b).mean
    rel = 100.0 * (mb - ma) / abs(ma) if ma else math.nan
    if len(a) < 2 or len(b) < 2:
        return Difference(rel, None, None)
    if max(a) == min(a) and max(b) == min(b):  # no spread at all: the t statistic is undefined
        return Difference(rel, 0.0 if ma != mb else 1.0, ma != mb)
    p = float(stats.ttest_ind(b, a, equal_var=False).pvalue)
    return Difference(rel, p, p < alpha)


def _key(row: Mapping[str, Any], fields: Iterable[str]) -> tuple[str, ...]:
    return tuple(str(row.get(k, "")) for k in fields)


def _values(rows: Iterable[Mapping[str, Any]], metric: str) -> list[float]:
    out = []
    for r in rows:
        v = number(r.get(metric)) if r.get("status") == "ok" else None
        if v is not None:
            out.append(v)
    return out


def groups(rows: Iterable[Mapping[str, Any]]) -> dict[tuple[str, ...], list[Mapping[str, Any]]]:
    """Rows by :data:`GROUP_KEY` (one cell of the matrix, all its repeats)."""
    out: dict[tuple[str, ...], list[Mapping[str, Any]]] = defaultdict(list)
    for r in rows:
        out[_key(r, GROUP_KEY)].append(r)
    return out


def references(rows: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], str]:
    """(experiment, engine) -> its reference format: the highest-bits format, if 16-bit."""
    best: dict[tuple[str, str], tuple[float, str]] = {}
    for r in rows:
        bits = number(r.get("bits_per_weight")) or 0.0
        k = (str(r.get("experiment")), str(r.get("engine")))
        if bits >= SIXTEEN_BITS and bits > best.get(k, (0.0, ""))[0]:
            best[k] = (bits, str(r.get("format")))
    return {k: fmt for k, (_bits, fmt) in best.items()}


@dataclass(frozen=True)
class Comparison:
    """One metric of one cell, variant ``b`` against variant ``a``."""

    kind: str  # "format": b against its engine's 16-bit variant a; "engine": 16-bit variants of two engines
    key: tuple[str, ...]  # the cell (CELL_KEY values)
    cell: str  # experiment, concurrency, prompt length, for people
    a: str
    b: str
    metric: str
    n_a: int
    n_b: int
    diff: Difference

    def line(self) -> str:
        p = "" if self.diff.p is None else f", p={self.diff.p:.3g}"
        return (f"{self.cell}: {self.b} vs {self.a}: {self.metric} {self.diff.rel_pct:+.1f}% "
                f"({self.n_b} vs {self.n_a} repeats{p})")


def _cell_label(row: Mapping[str, Any]) -> str:
    return f"{row.get('experiment')} c={row.get('concurrency')} p={row.get('prompt_len')}"


def comparisons(rows: Sequence[Mapping[str, Any]]) -> list[Comparison]:
    """Every variant against its engine's 16-bit variant, and each engine's 16-bit variant against the first's."""
    refs = references(rows)
    by_cell: dict[tuple[str, ...], dict[tuple[str, str], list[Mapping[str, Any]]]] = defaultdict(dict)
    for group in groups(rows).values():
        r = group[0]
        by_cell[_key(r, CELL_KEY)][(str(r["engine"]), str(r["format"]))] = group
    out = []
    for key, variants in by_cell.items():
        experiment = key[CELL_KEY.index("experiment")]
        ref_of = {v: (v[0], refs[(experiment, v[0])]) for v in variants if (experiment, v[0]) in refs}
        sixteen = sorted({ref for ref in ref_of.values() if ref in variants})
        pairs = [("format", ref, v) for v, ref in ref_of.items() if ref != v and ref in variants]
        pairs += [("engine", sixteen[0], other) for other in sixteen[1:]]
        for kind, a, b in pairs:
            ga, gb = variants[a], variants[b]
            for m in KEY_METRICS:
                va, vb = _values(ga, m), _values(gb, m)
                if va and vb:
                    out.append(Comparison(kind, key, _cell_label(ga[0]), variant_name(*a), variant_name(*b), m,
                                          len(va), len(vb), compare(va, vb)))
    return out


def _fmt(v: Any) -> Any:
    if isinstance(v, bool) or not isinstance(v, float):
        return v
    return "" if math.isnan(v) else f"{v:.6g}"


def extend(rows: list[dict[str, Any]]) -> list[str]:
    """Add :data:`COLUMNS` to every summary row in place (a group's values on each of its rows)."""
    vs_ref = {(c.key, c.b, c.metric): c for c in comparisons(rows) if c.kind == "format"}
    for group in groups(rows).values():
        first = group[0]
        cols: dict[str, Any] = {c: "" for c in COLUMNS}
        ok = [r for r in group if r.get("status") == "ok"]
        cols["repeats_ok"] = len(ok)
        cols["repeat_server_starts"] = len({r.get("server_start") for r in ok if r.get("server_start") not in (None, "")})
        for m in KEY_METRICS:
            if values := _values(group, m):
                cols.update(spread(values).columns(m))
            c = vs_ref.get((_key(first, CELL_KEY), variant_name(str(first["engine"]), str(first["format"])), m))
            if c is not None:
                cols["ref_variant"] = c.a
                cols[f"{m}_vs_ref_pct"] = c.diff.rel_pct
                cols[f"{m}_vs_ref_p"] = "" if c.diff.p is None else c.diff.p
                cols[f"{m}_vs_ref_significant"] = "" if c.diff.significant is None else c.diff.significant
        for r in group:
            r.update({k: _fmt(v) for k, v in cols.items()})
    return list(COLUMNS)
