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

Repeats run as blocks (bakeoff.loadgen.blocks): every variant once per block,
in a seeded order, on one node. Where both variants have the same two or more
blocks on one node, the comparison is paired by block (a paired t-test on the
per-block differences: the block is a factor, so drift between blocks cancels)
and ``vs_ref_ci95_pct`` is that difference's 95 % interval. Rows from
different nodes (``node_id``) are never paired or pooled: a comparison uses
the one node both variants ran on with the most repeats, and a cell whose two
variants share no node gets no comparison at all. How much the same cell moves
between nodes is reported on its own (:func:`node_spread`).
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
VS_REF = ("vs_ref_pct", "vs_ref_ci95_pct", "vs_ref_p", "vs_ref_significant")
ALPHA = 0.05
# A group is one cell of the matrix; its rows differ only by repeat.
# The node is part of the cell: the same cell on two nodes is two groups, never pooled or paired across.
# A capacity probe (probe_of, slo) is never pooled with the fixed cell at the same load.
GROUP_KEY = ("experiment", "model", "engine", "format", "hardware", "node_id", "concurrency", "prompt_len",
             "output_len", "request_rate", "probe_of", "slo")
# The same cell of another variant: everything but engine and format.
CELL_KEY = tuple(k for k in GROUP_KEY if k not in ("engine", "format"))

GROUP_COLUMNS = ["repeats_ok", "repeat_server_starts", *[f"{m}_{s}" for m in KEY_METRICS for s in STATS]]
COMPARE_COLUMNS = ["ref_variant", "vs_ref_pairing", *[f"{m}_{s}" for m in KEY_METRICS for s in VS_REF]]
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
    p: float | None  # two-sided p-value (Welch's, or paired by block); None without two values a side
    significant: bool | None  # p < ALPHA; None: no verdict
    ci95_pct: float = math.nan  # half-width of the 95 % interval of the difference, in percent of a's mean
    pairing: str = "welch"  # "welch" (independent repeats) or "blocks" (paired by block)

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
        return Difference(rel, 0.0 if ma != mb else 1.0, ma != mb, 0.0)
    res = stats.ttest_ind(b, a, equal_var=False)
    p = float(res.pvalue)
    ci = res.confidence_interval(0.95)
    half = 100.0 * (float(ci.high) - float(ci.low)) / 2.0 / abs(ma) if ma else math.nan
    return Difference(rel, p, p < alpha, half)


def compare_paired(a: Sequence[float], b: Sequence[float], alpha: float = ALPHA) -> Difference:
    """``b`` against ``a`` where ``a[i]`` and ``b[i]`` ran in the same block: a paired t-test on ``b - a``."""
    from scipy import stats

    if len(a) != len(b):
        raise ValueError(f"paired comparison needs one value a side per block, got {len(a)} and {len(b)}")
    ma, mb = spread(a).mean, spread(b).mean
    rel = 100.0 * (mb - ma) / abs(ma) if ma else math.nan
    if len(a) < 2:
        return Difference(rel, None, None, pairing="blocks")
    d = [y - x for x, y in zip(a, b, strict=True)]
    if max(d) == min(d):  # the same difference in every block: t is undefined
        return Difference(rel, 0.0 if d[0] else 1.0, bool(d[0]), 0.0, "blocks")
    res = stats.ttest_rel(b, a)
    p = float(res.pvalue)
    half = 100.0 * spread(d).ci95 / abs(ma) if ma else math.nan
    return Difference(rel, p, p < alpha, half, "blocks")


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
    node: str = ""  # the one node both variants' compared repeats ran on

    def line(self) -> str:
        p = "" if self.diff.p is None else f", p={self.diff.p:.3g}"
        ci = "" if math.isnan(self.diff.ci95_pct) else f" ± {self.diff.ci95_pct:.1f}%"
        how = f"{self.n_b} blocks, paired" if self.diff.pairing == "blocks" else f"{self.n_b} vs {self.n_a} repeats"
        return f"{self.cell}: {self.b} vs {self.a}: {self.metric} {self.diff.rel_pct:+.1f}%{ci} ({how}{p})"


def _cell_label(row: Mapping[str, Any]) -> str:
    return f"{row.get('experiment')} c={row.get('concurrency')} p={row.get('prompt_len')}"


def _on_node(group: Sequence[Mapping[str, Any]], node: str) -> list[Mapping[str, Any]]:
    return [r for r in group if str(r.get("node_id") or "") == node]


def pair(ga: Sequence[Mapping[str, Any]], gb: Sequence[Mapping[str, Any]],
          metric: str) -> tuple[Difference, int, int, str] | None:
    """One metric of two variants' repeats on the node they share (most repeats), paired by block where it can.

    None where they share no node: results from different nodes are never compared.
    """
    common = {str(r.get("node_id") or "") for r in ga} & {str(r.get("node_id") or "") for r in gb}
    if not common:
        return None
    node = max(sorted(common), key=lambda n: len(_values(_on_node(ga, n), metric)) + len(_values(_on_node(gb, n), metric)))
    ra, rb = _on_node(ga, node), _on_node(gb, node)

    def by_block(rows: Sequence[Mapping[str, Any]]) -> dict[str, float]:
        out = {}
        for r in rows:
            v = number(r.get(metric)) if r.get("status") == "ok" else None
            if v is not None and str(r.get("block", "")) != "":
                out[str(r["block"])] = v
        return out

    ba, bb = by_block(ra), by_block(rb)
    blocks = sorted(set(ba) & set(bb))
    if len(blocks) >= 2:
        return compare_paired([ba[k] for k in blocks], [bb[k] for k in blocks]), len(blocks), len(blocks), node
    va, vb = _values(ra, metric), _values(rb, metric)
    if not va or not vb:
        return None
    return compare(va, vb), len(va), len(vb), node


def comparisons(rows: Sequence[Mapping[str, Any]]) -> list[Comparison]:
    """Every variant against its engine's 16-bit variant, and each engine's 16-bit variant against the first's,
    within one node (paired by block where both ran the same blocks there)."""
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
                found = pair(ga, gb, m)
                if found is not None:
                    diff, n_a, n_b, node = found
                    out.append(Comparison(kind, key, _cell_label(ga[0]), variant_name(*a), variant_name(*b), m,
                                          n_a, n_b, diff, node))
    return out


@dataclass(frozen=True)
class NodeSpread:
    """One cell of one variant measured on several nodes: each node's mean, and the spread between them."""

    variant: str
    cell: str
    metric: str
    node_means: dict[str, float]

    @property
    def range_pct(self) -> float:
        """(max - min) of the node means over their median, in percent."""
        import statistics

        v = list(self.node_means.values())
        return 100.0 * (max(v) - min(v)) / statistics.median(v)


def node_spread(rows: Iterable[Mapping[str, Any]], metric: str = "output_throughput") -> list[NodeSpread]:
    """Every cell measured on more than one node: reported apart, never pooled into a comparison."""
    out = []
    across: dict[tuple[str, ...], list[Mapping[str, Any]]] = defaultdict(list)
    for r in rows:
        across[_key(r, tuple(k for k in GROUP_KEY if k != "node_id"))].append(r)
    for group in across.values():
        nodes: dict[str, list[float]] = defaultdict(list)
        for r in group:
            v = number(r.get(metric)) if r.get("status") == "ok" else None
            if v is not None:
                nodes[str(r.get("node_id") or "")].append(v)
        if len(nodes) > 1:
            r = group[0]
            out.append(NodeSpread(variant_name(str(r["engine"]), str(r["format"])), _cell_label(r), metric,
                                  {n: math.fsum(v) / len(v) for n, v in sorted(nodes.items())}))
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
                cols["vs_ref_pairing"] = c.diff.pairing
                cols[f"{m}_vs_ref_pct"] = c.diff.rel_pct
                cols[f"{m}_vs_ref_ci95_pct"] = c.diff.ci95_pct
                cols[f"{m}_vs_ref_p"] = "" if c.diff.p is None else c.diff.p
                cols[f"{m}_vs_ref_significant"] = "" if c.diff.significant is None else c.diff.significant
        for r in group:
            r.update({k: _fmt(v) for k, v in cols.items()})
    return list(COLUMNS)
