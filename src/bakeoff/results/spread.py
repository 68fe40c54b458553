"""Spread across repeats, and which differences between variants exceed it.

Why: one number per cell cannot say whether a 3 % gap between two formats is
real. With ``load.repeats`` > 1 every (variant, concurrency, prompt length)
group has one value per repeat of each key metric, and repeats after a server
restart (``load.restart_between_repeats``) put restart drift into that spread.

Per group: mean, sample standard deviation, coefficient of variation and the
half-width of the 95 % Student-t interval of the mean (``<metric>_ci95``; the
interval is mean ± that). With few repeats the t quantile is large (12.7 for
2 repeats, 4.3 for 3), which is the honest price of few repeats.

Two variants' difference gets one of three verdicts (:func:`verdict`), with its interval:

* **different**: the 95 % interval of the difference excludes 0 (the test's p < 0.05);
* **equivalent within +-m %**: the 90 % interval lies inside +-m, m = ``answer.equivalence_margin_pct``
  (two one-sided tests at 5 %, TOST). An interval that merely holds 0 shows nothing: with 2 blocks the
  95 % interval is 12.7 standard errors wide a side;
* **no verdict** otherwise, naming what would settle it: how many blocks (:func:`blocks_needed`) would,
  at the observed spread, call a true difference of m "different" and a true 0 "equivalent", each 80 %
  of the time.

Repeats run as blocks (bakeoff.loadgen.blocks): every variant once per block, in a seeded order, on one
node. Where both variants have the same two or more blocks on one node, the comparison is paired by
block: each block gives one relative difference, 100 (b - a) / a, so drift between blocks (multiplicative,
as clocks and heat make it) cancels; the verdict is a one-sample t on those, and each block's direction is
counted ("llamacpp-q4_k_m faster in 2 of 2 blocks"). Otherwise Welch's t-test on the repeats (it does not
assume the two variants are equally noisy, which engines and formats are not). Fewer than two ok repeats
on either side gives no verdict, never "different".

A block is one server start per variant (``server_start_id``, bakeoff.engines.session). A block whose
fixed cells came from more than one start (a job resumed after its node call ended, or a server restarted
after it died) is flagged ``block_resumed`` and left out of every paired verdict, with the reason: its
cells no longer ran side by side with the other variants' cells of that block. Rows from different nodes
(``node_id``) are never paired or pooled: a comparison uses the one node both variants ran on with the
most repeats, and a cell whose two variants share no node gets no comparison at all. How much the same
cell moves between nodes is reported on its own (:func:`node_spread`).
"""

from __future__ import annotations

import functools
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bakeoff.config.schema import AnswerCfg
from bakeoff.layout import variant_name
from bakeoff.results.baselines import SIXTEEN_BITS
from bakeoff.results.numbers import number

KEY_METRICS = ("output_throughput", "median_ttft_ms", "median_tpot_ms", "median_e2el_ms")
STATS = ("mean", "std", "cv_pct", "ci95")
VS_REF = ("vs_ref_pct", "vs_ref_ci95_pct", "vs_ref_ci90_pct", "vs_ref_p", "vs_ref_significant", "vs_ref_verdict",
          "vs_ref_blocks_needed", "vs_ref_faster_blocks")
ALPHA = 0.05  # "different": the (1 - ALPHA) two-sided interval excludes 0; "equivalent": the (1 - 2 ALPHA) one inside +-m
POWER = 0.8  # blocks_needed: the chance, at that many blocks, of each verdict its truth calls for
MOST_BLOCKS = 1000  # blocks_needed looks no further
DEFAULT_MARGIN_PCT = AnswerCfg().equivalence_margin_pct
DIFFERENT, EQUIVALENT, NO_VERDICT = "different", "equivalent", "no verdict"
# A group is one cell of the matrix; its rows differ only by repeat.
# The node is part of the cell: the same cell on two nodes is two groups, never pooled or paired across.
# A capacity probe (probe_of, slo) is never pooled with the fixed cell at the same load.
GROUP_KEY = ("experiment", "model", "engine", "format", "hardware", "node_id", "concurrency", "prompt_len",
             "output_len", "request_rate", "probe_of", "slo")
# The same cell of another variant: everything but engine and format.
CELL_KEY = tuple(k for k in GROUP_KEY if k not in ("engine", "format"))
# One variant's block on one node: all its cells that ran on (what should be) one server start.
BLOCK_KEY = ("experiment", "model", "engine", "format", "hardware", "node_id", "block")

BLOCK_COLUMNS = ["block_server_starts", "block_resumed"]
GROUP_COLUMNS = ["repeats_ok", "repeat_server_starts", *BLOCK_COLUMNS,
                 *[f"{m}_{s}" for m in KEY_METRICS for s in STATS]]
COMPARE_COLUMNS = ["ref_variant", "vs_ref_pairing", "vs_ref_blocks", "vs_ref_blocks_left_out",
                   "equivalence_margin_pct", *[f"{m}_{s}" for m in KEY_METRICS for s in VS_REF]]
COLUMNS = [*GROUP_COLUMNS, *COMPARE_COLUMNS]


def faster_when_higher(metric: str) -> bool:
    """Throughput is better higher; a latency (``_ms``) lower."""
    return not metric.endswith("_ms")


@functools.lru_cache(maxsize=4096)
def _t(q: float, df: float) -> float:
    """Student's t quantile (scipy's ufunc: the verdicts are simulated thousands of times in the tests)."""
    from scipy import special

    return float(special.stdtrit(df, q))


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
    n = len(values)
    if n == 0:
        return Spread(0, math.nan, math.nan, math.nan, math.nan)
    mean = math.fsum(values) / n
    if n == 1:
        return Spread(1, mean, math.nan, math.nan, math.nan)
    std = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))
    cv = 100.0 * std / abs(mean) if mean else math.nan
    return Spread(n, mean, std, cv, _t(0.975, n - 1) * std / math.sqrt(n))


@dataclass(frozen=True)
class Difference:
    """``b`` against ``a``: the estimate, its 95 % and 90 % intervals (both mean +- half-width, in percent of
    ``a``), the test, and for a paired comparison each block's direction."""

    rel_pct: float  # paired: the mean of the blocks' 100 (b - a) / a; Welch: (mean b - mean a) / mean a, in %
    p: float | None  # two-sided p-value; None without two values a side
    significant: bool | None  # p < ALPHA, i.e. the 95 % interval excludes 0; None: too few values to test
    ci95_pct: float = math.nan  # half-width of the 95 % interval of rel_pct, in percentage points
    pairing: str = "welch"  # "welch" (independent repeats) or "blocks" (paired by block)
    ci90_pct: float = math.nan  # half-width of the 90 % interval (the equivalence test's)
    sd_pct: float = math.nan  # spread of one pair's difference, in % of a: the blocks' sd (paired), else Welch's
    n: int = 0  # blocks paired, or the smaller side's repeats (Welch)
    b_faster: int = 0  # blocks in which b was faster than a (paired only)
    a_faster: int = 0  # blocks in which a was faster than b

    @property
    def verdict(self) -> str:  # the test alone; :func:`verdict` adds equivalence
        return {True: "significant", False: "not significant", None: "no verdict (fewer than 2 repeats)"}[self.significant]

    @property
    def ci95(self) -> tuple[float, float]:
        return self.rel_pct - self.ci95_pct, self.rel_pct + self.ci95_pct

    @property
    def ci90(self) -> tuple[float, float]:
        return self.rel_pct - self.ci90_pct, self.rel_pct + self.ci90_pct


def compare(a: Sequence[float], b: Sequence[float], alpha: float = ALPHA) -> Difference:
    """Is ``b`` different from ``a`` beyond the spread of their repeats? (Welch's t-test)."""
    from scipy import stats

    sa, sb = spread(a), spread(b)
    ma, mb = sa.mean, sb.mean
    rel = 100.0 * (mb - ma) / abs(ma) if ma else math.nan
    n = min(len(a), len(b))
    if len(a) < 2 or len(b) < 2:
        return Difference(rel, None, None, n=n)
    sd = 100.0 * math.sqrt(sa.std ** 2 + sb.std ** 2) / abs(ma) if ma else math.nan
    if max(a) == min(a) and max(b) == min(b):  # no spread at all: the t statistic is undefined
        return Difference(rel, 0.0 if ma != mb else 1.0, ma != mb, 0.0, ci90_pct=0.0, sd_pct=0.0, n=n)
    res = stats.ttest_ind(b, a, equal_var=False)
    p = float(res.pvalue)

    def half(level: float) -> float:
        ci = res.confidence_interval(level)
        return 100.0 * (float(ci.high) - float(ci.low)) / 2.0 / abs(ma) if ma else math.nan

    return Difference(rel, p, p < alpha, half(1 - alpha), ci90_pct=half(1 - 2 * alpha), sd_pct=sd, n=n)


def compare_paired(a: Sequence[float], b: Sequence[float], alpha: float = ALPHA,
                   higher_is_faster: bool = True) -> Difference:
    """``b`` against ``a`` where ``a[i]`` and ``b[i]`` ran in the same block: a t-test on the blocks' relative
    differences 100 (b - a) / a, and the blocks in which each was faster."""
    from scipy import special

    if len(a) != len(b):
        raise ValueError(f"paired comparison needs one value a side per block, got {len(a)} and {len(b)}")
    if any(x == 0 for x in a):
        raise ValueError(f"paired comparison needs a non-zero reference value in every block, got {list(a)}")
    n = len(a)
    d = [100.0 * (y - x) / abs(x) for x, y in zip(a, b, strict=True)]
    b_faster = sum((y > x) == higher_is_faster and y != x for x, y in zip(a, b, strict=True))
    a_faster = sum(y != x for x, y in zip(a, b, strict=True)) - b_faster
    rel = math.fsum(d) / n if n else math.nan
    common = {"pairing": "blocks", "n": n, "b_faster": b_faster, "a_faster": a_faster}
    if n < 2:
        return Difference(rel, None, None, **common)
    sd = spread(d).std
    if sd == 0:  # the same difference in every block: t is undefined, the intervals are a point
        return Difference(rel, 0.0 if rel else 1.0, bool(rel), 0.0, ci90_pct=0.0, sd_pct=0.0, **common)
    se = sd / math.sqrt(n)
    p = float(2.0 * special.stdtr(n - 1, -abs(rel) / se))
    return Difference(rel, p, p < alpha, _t(1 - alpha / 2, n - 1) * se, ci90_pct=_t(1 - alpha, n - 1) * se,
                      sd_pct=sd, **common)


@functools.lru_cache(maxsize=16)
def _resolving(power: float, alpha: float, most: int) -> Any:
    """For n = 2..most: the largest spread-to-margin ratio (sd / m) that n blocks settle (see blocks_needed)."""
    import numpy as np
    from scipy import special

    n = np.arange(2, most + 1)
    df = n - 1
    differ = special.stdtrit(df, 1 - alpha / 2) + special.stdtrit(df, power)
    equal = special.stdtrit(df, 1 - alpha) + special.stdtrit(df, 1 - (1 - power) / 2)
    return np.sqrt(n) / np.maximum(differ, equal)  # increasing in n


def blocks_needed(sd_pct: float, margin_pct: float, power: float = POWER, alpha: float = ALPHA,
                  most: int = MOST_BLOCKS) -> int | None:
    """Blocks that would settle a comparison whose blocks' differences spread by ``sd_pct``: the fewest at which
    a true difference of ``margin_pct`` is called different, and a true 0 equivalent within it, each with
    probability ``power`` (the t approximations of the two tests' power: (t_{1-a/2} + t_{power}) se <= m and
    (t_{1-a} + t_{(1+power)/2}) se <= m, se = sd / sqrt(n)). None: more than ``most``."""
    import numpy as np

    if not margin_pct > 0:
        raise ValueError(f"the equivalence margin must be positive, got {margin_pct}")
    if math.isnan(sd_pct):
        return None
    ratios = _resolving(power, alpha, most)
    i = int(np.searchsorted(ratios, sd_pct / margin_pct, side="left"))
    return i + 2 if i < len(ratios) else None


@dataclass(frozen=True)
class Verdict:
    """One of :data:`DIFFERENT`, :data:`EQUIVALENT`, :data:`NO_VERDICT`, and what it rests on, in words."""

    kind: str
    margin_pct: float
    needed: int | None = None  # no verdict: blocks (or repeats a side, Welch) that would settle it
    why: str = ""  # no verdict: why (too few values, blocks left out, an interval too wide)

    def words(self, diff: Difference) -> str:
        """The verdict as the answer page says it, with the interval it rests on."""
        m = f"{self.margin_pct:g}"
        if self.kind == DIFFERENT:
            lo, hi = diff.ci95
            inside = -self.margin_pct <= diff.ci90[0] and diff.ci90[1] <= self.margin_pct
            small = f"; smaller than the ±{m}% margin" if inside else ""
            return f"different: {diff.rel_pct:+.1f}% (95% interval {lo:+.1f}% to {hi:+.1f}%{small})"
        if self.kind == EQUIVALENT:
            lo, hi = diff.ci90
            return f"equivalent within ±{m}%: {diff.rel_pct:+.1f}% (90% interval {lo:+.1f}% to {hi:+.1f}%)"
        if self.why:
            return f"no verdict: {self.why}"
        lo, hi = diff.ci95
        unit = "blocks" if diff.pairing == "blocks" else "repeats a side"
        settle = (f"about {self.needed} {unit} would settle a difference of {m}%" if self.needed is not None else
                  f"more than {MOST_BLOCKS} {unit} would be needed to settle a difference of {m}%")
        return (f"no verdict: {diff.rel_pct:+.1f}%, 95% interval {lo:+.1f}% to {hi:+.1f}% holds 0 and reaches past "
                f"±{m}%; at the observed spread ({diff.sd_pct:.2g}% a block) {settle}")


def verdict(diff: Difference, margin_pct: float = DEFAULT_MARGIN_PCT) -> Verdict:
    """Different where the 95 % interval excludes 0; equivalent where the 90 % interval lies inside
    +-``margin_pct``; else no verdict, with the blocks that would settle it."""
    if not margin_pct > 0:
        raise ValueError(f"answer.equivalence_margin_pct must be positive, got {margin_pct}")
    if diff.significant is None or math.isnan(diff.rel_pct):
        side = "blocks" if diff.pairing == "blocks" else "ok repeats a side"
        return Verdict(NO_VERDICT, margin_pct, why=f"fewer than 2 {side}")
    if diff.significant:
        return Verdict(DIFFERENT, margin_pct)
    lo, hi = diff.ci90
    if -margin_pct <= lo and hi <= margin_pct:
        return Verdict(EQUIVALENT, margin_pct)
    return Verdict(NO_VERDICT, margin_pct, blocks_needed(diff.sd_pct, margin_pct))


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


def block_starts(rows: Iterable[Mapping[str, Any]]) -> dict[tuple[str, ...], set[str]]:
    """Each variant's block on each node (:data:`BLOCK_KEY`) -> the server starts its fixed cells ran on.

    Only rows that record a start (``server_start_id``; a start that failed made no measured cell) count;
    capacity probes are left out, as they are out of the paired comparisons.
    """
    out: dict[tuple[str, ...], set[str]] = defaultdict(set)
    for r in rows:
        sid = r.get("server_start_id")
        if not r.get("probe_of") and str(r.get("block", "")) != "" and sid not in (None, ""):
            out[_key(r, BLOCK_KEY)].add(str(sid))
    return dict(out)


def resumed_blocks(rows: Iterable[Mapping[str, Any]]) -> dict[tuple[str, ...], int]:
    """The blocks (:data:`BLOCK_KEY`) whose cells came from more than one server start, with how many."""
    return {k: len(v) for k, v in block_starts(rows).items() if len(v) > 1}


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
class Paired:
    """Two variants' comparison on one metric of one cell: the difference, on which node, and the blocks left out."""

    diff: Difference
    n_a: int
    n_b: int
    node: str
    left_out: tuple[str, ...] = ()  # "block 1: llamacpp-q4_k_m's cells came from 2 server starts", one per block

    def verdict(self, margin_pct: float = DEFAULT_MARGIN_PCT) -> Verdict:
        v = verdict(self.diff, margin_pct)
        if v.kind == NO_VERDICT and self.left_out and v.why:
            return Verdict(NO_VERDICT, margin_pct, why=f"{v.why} once resumed blocks are left out ({self.why_left_out})")
        return v

    @property
    def why_left_out(self) -> str:
        return "; ".join(self.left_out)


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
    left_out: tuple[str, ...] = ()  # resumed blocks left out of the pairing, and why

    def verdict(self, margin_pct: float = DEFAULT_MARGIN_PCT) -> Verdict:
        return Paired(self.diff, self.n_a, self.n_b, self.node, self.left_out).verdict(margin_pct)

    def directions(self) -> str:
        """Each block's direction, for people: "llamacpp-q4_k_m faster in 2 of 2 blocks"."""
        return directions(self.diff, self.a, self.b)

    def line(self, margin_pct: float = DEFAULT_MARGIN_PCT) -> str:
        p = "" if self.diff.p is None else f", p={self.diff.p:.3g}"
        how = f"{self.n_b} blocks, paired" if self.diff.pairing == "blocks" else f"{self.n_b} vs {self.n_a} repeats"
        dirs = f"; {d}" if (d := self.directions()) else ""
        left = f"; left out: {'; '.join(self.left_out)}" if self.left_out else ""
        return (f"{self.cell}: {self.b} vs {self.a}: {self.metric} {self.verdict(margin_pct).words(self.diff)} "
                f"({how}{p}{dirs}{left})")


def directions(diff: Difference, a: str, b: str) -> str:
    """Which variant was faster in how many of the paired blocks ("" without blocks)."""
    if diff.pairing != "blocks" or not diff.n:
        return ""
    first, k, other, j = (b, diff.b_faster, a, diff.a_faster) if diff.b_faster >= diff.a_faster else \
        (a, diff.a_faster, b, diff.b_faster)
    out = f"{first} faster in {k} of {diff.n} block{'s' if diff.n != 1 else ''}"
    if j:
        out += f", {other} in {j}"
    if (same := diff.n - k - j):
        out += f", equal in {same}"
    return out


def _cell_label(row: Mapping[str, Any]) -> str:
    return f"{row.get('experiment')} c={row.get('concurrency')} p={row.get('prompt_len')}"


def _on_node(group: Sequence[Mapping[str, Any]], node: str) -> list[Mapping[str, Any]]:
    return [r for r in group if str(r.get("node_id") or "") == node]


def _block_order(block: str) -> tuple[int, str]:
    return (int(block), "") if block.isdigit() else (1 << 30, block)


def pair(ga: Sequence[Mapping[str, Any]], gb: Sequence[Mapping[str, Any]], metric: str,
         resumed: Mapping[tuple[str, ...], int] | None = None) -> Paired | None:
    """One metric of two variants' repeats on the node they share (most repeats), paired by block where it can.

    ``resumed`` (:func:`resumed_blocks` of all the rows): a block resumed for either variant is left out for
    both, and the result says so. None where they share no node: results from different nodes are never compared.
    """
    common = {str(r.get("node_id") or "") for r in ga} & {str(r.get("node_id") or "") for r in gb}
    if not common:
        return None
    node = max(sorted(common), key=lambda n: len(_values(_on_node(ga, n), metric)) + len(_values(_on_node(gb, n), metric)))
    ra, rb = _on_node(ga, node), _on_node(gb, node)
    bad: dict[str, list[str]] = defaultdict(list)
    for r in (*ra, *rb):
        starts = (resumed or {}).get(_key(r, BLOCK_KEY))
        who = f"{variant_name(str(r['engine']), str(r['format']))}'s cells came from {starts} server starts"
        if starts and who not in bad[str(r.get("block"))]:
            bad[str(r.get("block"))].append(who)
    left_out = tuple(f"block {b}: {', '.join(bad[b])}" for b in sorted(bad, key=_block_order) if bad[b])
    if left_out:
        ra = [r for r in ra if not bad.get(str(r.get("block")))]
        rb = [r for r in rb if not bad.get(str(r.get("block")))]

    def by_block(rows: Sequence[Mapping[str, Any]]) -> dict[str, float]:
        out = {}
        for r in rows:
            v = number(r.get(metric)) if r.get("status") == "ok" else None
            if v is not None and str(r.get("block", "")) != "":
                out[str(r["block"])] = v
        return out

    ba, bb = by_block(ra), by_block(rb)
    blocks = sorted(set(ba) & set(bb), key=_block_order)
    if len(blocks) >= 2 or (left_out and blocks):
        diff = compare_paired([ba[k] for k in blocks], [bb[k] for k in blocks],
                              higher_is_faster=faster_when_higher(metric))
        return Paired(diff, len(blocks), len(blocks), node, left_out)
    va, vb = _values(ra, metric), _values(rb, metric)
    if not va or not vb:
        if left_out:  # every block they shared was resumed
            return Paired(Difference(math.nan, None, None, pairing="blocks"), 0, 0, node, left_out)
        return None
    return Paired(compare(va, vb), len(va), len(vb), node, left_out)


def comparisons(rows: Sequence[Mapping[str, Any]]) -> list[Comparison]:
    """Every variant against its engine's 16-bit variant, and each engine's 16-bit variant against the first's,
    within one node (paired by block where both ran the same blocks there; resumed blocks left out)."""
    refs = references(rows)
    resumed = resumed_blocks(rows)
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
                found = pair(ga, gb, m, resumed)
                if found is not None:
                    out.append(Comparison(kind, key, _cell_label(ga[0]), variant_name(*a), variant_name(*b), m,
                                          found.n_a, found.n_b, found.diff, found.node, found.left_out))
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


def margins_of(points: Mapping[str, Any]) -> dict[str, float]:
    """Each experiment's ``answer.equivalence_margin_pct`` from the sweep points (results/config.json)."""
    return {name: float(((pt.get("config") or {}).get("answer") or {}).get("equivalence_margin_pct",
                                                                             DEFAULT_MARGIN_PCT))
            for name, pt in points.items()}


def margin_of(row: Mapping[str, Any]) -> float:
    """The margin a summary row was judged with; the default for a summary written before it was recorded."""
    m = number(row.get("equivalence_margin_pct"))
    return DEFAULT_MARGIN_PCT if m is None else m


def extend(rows: list[dict[str, Any]], margins: Mapping[str, float] | None = None) -> list[str]:
    """Add :data:`COLUMNS` to every summary row in place (a group's values on each of its rows).

    ``margins``: experiment -> its equivalence margin in percent (:func:`margins_of`); the default elsewhere.
    """
    for name, m in (margins or {}).items():
        if not m > 0:
            raise ValueError(f"answer.equivalence_margin_pct of experiment {name!r} must be positive, got {m}")
    vs_ref = {(c.key, c.b, c.metric): c for c in comparisons(rows) if c.kind == "format"}
    starts = block_starts(rows)
    for group in groups(rows).values():
        first = group[0]
        margin = (margins or {}).get(str(first.get("experiment")), DEFAULT_MARGIN_PCT)
        cols: dict[str, Any] = {c: "" for c in COLUMNS}
        ok = [r for r in group if r.get("status") == "ok"]
        cols["repeats_ok"] = len(ok)
        cols["repeat_server_starts"] = len({r.get("server_start_id") or r.get("server_start") for r in ok
                                            if (r.get("server_start_id") or r.get("server_start")) not in (None, "")})
        cols["equivalence_margin_pct"] = margin
        for m in KEY_METRICS:
            if values := _values(group, m):
                cols.update(spread(values).columns(m))
            c = vs_ref.get((_key(first, CELL_KEY), variant_name(str(first["engine"]), str(first["format"])), m))
            if c is not None:
                v = c.verdict(margin)
                cols["ref_variant"] = c.a
                cols["vs_ref_pairing"] = c.diff.pairing
                cols["vs_ref_blocks"] = c.n_b if c.diff.pairing == "blocks" else ""
                cols["vs_ref_blocks_left_out"] = "; ".join(c.left_out)
                cols[f"{m}_vs_ref_pct"] = c.diff.rel_pct
                cols[f"{m}_vs_ref_ci95_pct"] = c.diff.ci95_pct
                cols[f"{m}_vs_ref_ci90_pct"] = c.diff.ci90_pct
                cols[f"{m}_vs_ref_p"] = "" if c.diff.p is None else c.diff.p
                cols[f"{m}_vs_ref_significant"] = "" if c.diff.significant is None else c.diff.significant
                cols[f"{m}_vs_ref_verdict"] = v.kind
                cols[f"{m}_vs_ref_blocks_needed"] = "" if v.needed is None else v.needed
                cols[f"{m}_vs_ref_faster_blocks"] = c.diff.b_faster if c.diff.pairing == "blocks" else ""
        for r in group:
            own = {**cols}
            if not r.get("probe_of") and (k := _key(r, BLOCK_KEY)) in starts:
                own["block_server_starts"] = len(starts[k])
                own["block_resumed"] = len(starts[k]) > 1
            r.update({k: _fmt(v) for k, v in own.items()})
    return list(COLUMNS)
