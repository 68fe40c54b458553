"""The capacity search: the highest load one variant serves while its p99 latencies meet an SLO.

Why a search: fixed concurrency points leave the question a user asks ("how many users within my latency
target?") to the reader. Peers search too (`vllm bench sweep serve_sla`, AIPerf, MLPerf's server
scenario), each for one engine; here every engine is probed by the same client and judged by one rule.

The rules, stated once:

* **Verdict, by one of two rules** (``load.capacity.verdict``):

  - ``point``: a probe passes when every request succeeded and its p99 TTFT and p99 TPOT (numpy's
    interpolated 99th percentile, as in every cell) are at or under the SLO's bounds. A point estimate:
    with 64 requests and none over, the true share over a bound may still be 4.6 %.
  - ``confident``: the point rule, and for each bound the one-sided 95 % (Clopper-Pearson) upper bound on
    the share of requests over it is at most 1 %, so the true p99 is within the bound with 95 %
    confidence. By the interval's duality that bound is at most 1 % exactly where
    ``P(B <= k) <= 0.05`` for ``B ~ Binomial(n, 0.01)`` and ``k`` requests over the bound of ``n``
    (``allowance``): 299 requests with none over at least (``0.99^n <= 0.05``), more where some are over
    (1 of 473, 2 of 628, ...). This is MLPerf's early-stopping rule for a p99. Whatever the latency's
    shape, a probe whose true share over a bound is above 1 % passes at most 5 % of the time, where its
    requests are independent of one another. Where they are not (a server's slow episodes, which a closed loop
    sees as runs of slow requests), it passes more often: every probe and capacity row says whether the
    claim holds (``confident_claim_holds``, bakeoff.loadgen.dependence).

* **Probe length.** ``max(min_requests, waves x c)`` measured requests, after ``c`` uncounted warm-up
  requests; under ``confident`` at least ``MIN_CONFIDENT_REQUESTS`` (299), the fewest with which the rule
  can pass (``probe_requests``). With fewer than 100 requests a point p99 lies near the slowest request, so
  a short probe errs towards failing, never towards passing.
* **Early stop (per bound).** Violations are counted per bound; the probe stops as soon as one bound's
  count makes failure certain under the rule in force, even if every remaining request is under
  (``violation_limit``). Point: once the count reaches ``n - floor(0.99 (n - 1))`` of ``n``, both order
  statistics that bound's p99 interpolates between are over it. Confident: once the count exceeds
  ``allowance(n)``, since the upper bound only grows with the count and ``n`` is fixed. A failed request
  fails the probe at once. A request over TTFT only and another over TPOT only are one violation of each
  bound, not two of one. The probe stops sending; requests in flight finish.
* **Concurrency search (closed loop).** The bracket starts from what the variant's fixed cells showed at
  the same prompt length: the highest concurrency that met the SLO below the lowest that failed is a known
  pass, that lowest fail a known fail (under ``confident`` only the fails seed it:
  bakeoff.serving.capacity.fixed_verdicts). From there (else from ``start``) it doubles until a probe fails
  or ``maximum`` passes, then bisects between the highest pass and the lowest fail until they are within
  the resolution (``load.capacity.resolution``, default 5 %): ``fail - pass <= max(1, floor(resolution x
  pass))`` (``within_resolution``), so 5 % of the pass and never under 1 user. Probes closer than that
  resolve differences smaller than a probe's run-to-run noise, and each costs a full probe. The answer is
  the bracket, ``pass–fail`` (``Search.bracket``); ``capacity`` is its pass. The default probe budget is
  the most probes this needs for any capacity in ``0..maximum`` at that resolution (``probes_needed``), so
  the search always converges; with noisy probes too, since every verdict it asks for lies inside the
  bracket, and so agrees with some capacity's noiseless run.
* **Boundary re-check.** A probe near the capacity can pass or fail by chance, and one noisy fail sends a
  bisection down for good. At the end the highest pass and the lowest fail are each probed once more;
  where either run disagrees with the first, the capacity is reported as uncertain, with both results.
* **Rate search (open loop, Poisson arrivals, no cap on requests in flight).** From ``start`` (the
  closed-loop capacity's request rate), multiply or divide by ``RATE_STEP`` until a pass and a fail
  bracket the capacity, then bisect geometrically until ``fail / pass <= 1 + resolution``. At the default
  resolution (0.1) three bisections take a bracket of 1.5 under 1.1 (two leave 1.107), so the default
  budget, ``RATE_PROBES`` (8), converges wherever the capacity is within 1.5^4 (5x) of the start: 1 + k
  probes to bracket it k steps away, then 3. The closed loop's rate at its capacity and the open loop's
  capacity share a server and an SLO; a start 5x off would mean the Poisson arrivals alone moved the
  capacity that far. A search short of its budget says so (not converged), its bracket still true.
* **Limits.** The search never probes past ``maximum``: the search's own ceiling
  (``load.capacity.max_concurrency``) or the server's limit where that is lower (vLLM's ``max_num_seqs`` or its
  KV cache, llama.cpp's slots; bakeoff.serving.capacity.search_limit), named in ``limit``. A search whose
  probe at that maximum passed found a lower bound, not a capacity: it is never reported as converged.
* A search that hits its ``max_probes`` says it did not converge; its capacity is then a lower bound.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Literal

import numpy as np

from bakeoff.config.slo import SLO_PRESETS, Slo
from bakeoff.loadgen.metrics import RequestRecord
from bakeoff.loadgen.orderstats import LEVEL, MIN_CONFIDENT_REQUESTS, P99_SHARE

__all__ = ["SLO_PRESETS", "Slo", "EarlyStop", "Search", "Verdict", "allowance", "bracket_from_cells", "judge",
           "probe_requests", "probes_needed", "search_concurrency", "search_rate", "within_resolution"]

Rule = Literal["point", "confident"]
RULES: tuple[Rule, ...] = ("point", "confident")
RATE_STEP = 1.5
RATE_PROBES = 8  # the rate search's budget where none is configured
RESOLUTION = 0.05  # the concurrency search's default: stop within 5 % of the highest pass (within_resolution)
TOO_FEW = "too few requests"  # a confident verdict's reason where the probe read too few to pass (judge)


@lru_cache(maxsize=4096)
def allowance(n: int) -> int:
    """The most requests of ``n`` over a bound at which the one-sided 95 % upper bound on the share over it is
    still at most 1 % (-1: ``n`` is too small for any). Clopper-Pearson's bound is at most ``p`` exactly where
    ``P(B <= k) <= 1 - level`` for ``B ~ Binomial(n, p)``, and that probability grows with ``k``."""
    from scipy.stats import binom

    if n <= 0:
        return -1
    return int(np.count_nonzero(binom.cdf(np.arange(n + 1), n, P99_SHARE) <= 1.0 - LEVEL)) - 1


def _check_rule(rule: str) -> None:
    if rule not in RULES:
        raise ValueError(f"capacity verdict rule {rule!r} is unknown; known: {', '.join(RULES)}")


def violation_limit(n: int, rule: Rule = "point") -> int:
    """Requests of ``n`` over one bound that make the probe's failure certain under ``rule`` (the module's
    early-stop rule): point, the p99 of ``n`` is then over the bound; confident, its upper bound is over 1 %."""
    _check_rule(rule)
    if rule == "confident":
        return allowance(n) + 1
    return n - math.floor(0.99 * (n - 1))


def probe_requests(concurrency: int, min_requests: int, waves: int, rule: Rule = "point") -> int:
    """A probe's measured requests: ``max(min_requests, waves x c)``, and under ``confident`` at least the
    fewest with which it can pass."""
    _check_rule(rule)
    return max(min_requests, waves * concurrency, MIN_CONFIDENT_REQUESTS if rule == "confident" else 0)


def over(record: RequestRecord, slo: Slo) -> list[str]:
    """The bounds one request exceeded ("failed" when it did not complete)."""
    if not record.success:
        return ["failed"]
    tpot = record.tpot
    out = ["ttft"] if 1000.0 * record.ttft > slo.ttft_ms else []
    return out + (["tpot"] if tpot is not None and 1000.0 * tpot > slo.tpot_ms else [])


@dataclass
class EarlyStop:
    """The runner's ``stop_when`` for a probe of ``n`` requests: True once failure is certain."""

    n: int
    slo: Slo
    rule: Rule = "point"
    violations: Counter[str] = field(default_factory=Counter)  # per bound ("ttft", "tpot"; "failed")

    def __post_init__(self) -> None:
        _check_rule(self.rule)
        if self.rule == "confident" and self.n < MIN_CONFIDENT_REQUESTS:
            raise ValueError(f"a confident probe of {self.n} requests can never pass: it needs at least "
                             f"{MIN_CONFIDENT_REQUESTS} (size it with probe_requests)")

    def __call__(self, record: RequestRecord) -> bool:
        # A request sent while the load ramps up is outside the steady span the verdict judges: it neither
        # counts against a bound nor fails the probe. getattr: records from before the field read as steady.
        if getattr(record, "ramp", False):
            return False
        self.violations.update(over(record, self.slo))
        if self.violations["failed"]:
            return True
        limit = violation_limit(self.n, self.rule)
        return any(count >= limit for bound, count in self.violations.items() if bound != "failed")


@dataclass(frozen=True)
class Verdict:
    passed: bool
    exceeded: tuple[str, ...] = ()  # the bounds the probe's p99s exceeded, or "failed" requests
    stopped_early: bool = False


def confident_within(metrics: Mapping[str, Any], bound: str) -> bool:
    """The 95 % upper bound on the share of the completed requests over ``bound`` is at most 1 %.

    Reads ``over_<bound>_share`` of the requests the latency statistics read (``steady_requests``: after a ramp,
    the steady span's; else ``completed``): the metrics must have been summarized against the SLO's bounds (a
    probe's are); where that share is missing nothing is shown, so the rule does not pass.
    """
    n = metrics.get("steady_requests", metrics.get("completed"))
    share = metrics.get(f"over_{bound}_share")
    if not n or share is None:
        return False
    return round(float(share) * int(n)) <= allowance(int(n))


def judge(metrics: Mapping[str, Any], slo: Slo, stopped_early: bool = False, rule: Rule = "point") -> Verdict:
    """A probe's verdict from its cell metrics (``summarize``'s keys) under ``rule`` (the module's Verdict).

    Under ``confident`` a probe that read fewer than ``MIN_CONFIDENT_REQUESTS`` requests cannot pass whatever its
    latencies: its verdict names that (``too few requests``) beside any bound its p99s exceeded, not the bounds
    they met."""
    _check_rule(rule)
    point = [k for k, bound in slo.bounds().items()
             if not (metrics.get(f"p99_{k}_ms") is not None and metrics[f"p99_{k}_ms"] <= bound)]
    exceeded = list(point)
    if rule == "confident":
        if int(metrics.get("steady_requests", metrics.get("completed")) or 0) < MIN_CONFIDENT_REQUESTS:
            exceeded.append(TOO_FEW)
        else:
            exceeded = [k for k in slo.bounds() if k in point or not confident_within(metrics, k)]
    if metrics.get("failed"):
        exceeded.append("failed")
    return Verdict(not exceeded and not stopped_early, tuple(exceeded) or (("early stop",) if stopped_early else ()),
                   stopped_early)


@dataclass
class Search:
    """One search's probes, in the order run, and what they found."""

    kind: str  # "concurrency" | "rate"
    probes: list[tuple[float, Verdict]] = field(default_factory=list)
    converged: bool = False
    capacity: float = 0.0  # the highest passing load (0: even the lowest probed failed)
    fail: float | None = None  # the lowest failing load, the bracket's top (None: none failed)
    at_limit: bool = False  # the highest load allowed passed: capacity is at least this
    limit: str = "search maximum"  # what set the highest load allowed (module docstring: Limits)
    seeded: dict[str, int] = field(default_factory=dict)  # {"pass": c, "fail": c} taken from the fixed cells
    rechecks: list[tuple[float, Verdict, bool]] = field(default_factory=list)  # (load, re-run verdict, first passed)

    @property
    def bracket(self) -> str:
        """The answer as a reader quotes it: ``"192–200"`` (highest pass–lowest fail), or ``"at least 1024"``
        where nothing above the highest pass failed (a lower bound)."""
        show = (lambda v: f"{v:.4g}") if self.kind == "rate" else (lambda v: f"{v:g}")
        if self.fail is None:
            return f"at least {show(self.capacity)}"
        return f"{show(self.capacity)}–{show(self.fail)}"

    @property
    def binding(self) -> str:
        """What bound the lowest failing probe exceeded ('' where none failed)."""
        fails = sorted((v, d) for v, d in self.probes if not d.passed)
        return "+".join(fails[0][1].exceeded) if fails else ""

    @property
    def uncertain(self) -> bool:
        """A boundary re-check disagreed with the first result at that load."""
        return any(v.passed != first for _, v, first in self.rechecks)

    @property
    def recheck_note(self) -> str:
        """Each re-checked load with its two results: ``"12: pass, pass; 13: fail, pass"``."""
        word = {True: "pass", False: "fail"}
        return "; ".join(f"{load:g}: {word[first]}, {word[v.passed]}" for load, v, first in self.rechecks)


def bracket_from_cells(met: dict[int, bool]) -> tuple[int, int | None]:
    """(known pass, known fail) from fixed cells' verdicts by concurrency: the lowest fail, the highest pass below it."""
    fails = [c for c, ok in met.items() if not ok]
    fail = min(fails) if fails else None
    passes = [c for c, ok in met.items() if ok and (fail is None or c < fail)]
    return max(passes, default=0), fail


def within_resolution(passed: float, failed: float, resolution: float = RESOLUTION) -> bool:
    """Highest pass and lowest fail are close enough to stop: ``failed - passed <= max(1, floor(resolution x
    passed))``. The 1e-9 keeps a product such as 0.05 x 60 from flooring one user short."""
    return failed - passed <= max(1, math.floor(resolution * passed + 1e-9))


def _bisect_concurrency(probe: Callable[[int], Verdict], s: Search, start: int, maximum: int, budget: int,
                        known_pass: int, known_fail: int | None,
                        resolution: float = RESOLUTION) -> tuple[int, int | None]:
    seen: dict[int, Verdict] = {}
    passed = min(known_pass, maximum)
    failed = known_fail if known_fail is not None and known_fail <= maximum and known_fail > passed else None
    if passed >= maximum:
        s.at_limit = True
        return passed, failed
    if failed is not None and within_resolution(passed, failed, resolution):
        s.converged = True
        return passed, failed
    c = (passed + failed) // 2 if failed is not None else min(2 * passed, maximum) if passed else max(1, min(start, maximum))
    while len(seen) < budget:
        seen[c] = probe(c)
        s.probes.append((c, seen[c]))
        if seen[c].passed:
            passed = max(passed, c)
        else:
            failed = c if failed is None else min(failed, c)
        if failed is None:  # bracketing upwards
            if c >= maximum:
                s.at_limit = True  # a lower bound: never converged
                break
            c = min(2 * c, maximum)
            continue
        if within_resolution(passed, failed, resolution):
            s.converged = True
            break
        c = (passed + failed) // 2  # bisect (with no pass yet: halve, bracketing downwards)
    return passed, failed


@lru_cache(maxsize=64)
def probes_needed(start: int, maximum: int, resolution: float = RESOLUTION) -> int:
    """The most probes the concurrency search takes at ``resolution``, without seeds, over every true capacity
    in 0..maximum (cached: a search without a budget asks for it, and it runs the search once a capacity)."""
    worst = 0
    for truth in range(maximum + 1):
        s = Search("concurrency")
        _bisect_concurrency(lambda c, t=truth: Verdict(c <= t), s, start, maximum, maximum + 1, 0, None, resolution)
        worst = max(worst, len(s.probes))
    return worst


def search_concurrency(probe: Callable[[int], Verdict], start: int, maximum: int, max_probes: int | None = None,
                       known_pass: int = 0, known_fail: int | None = None, recheck: bool = True,
                       limit: str = "search maximum", resolution: float = RESOLUTION) -> Search:
    """The closed-loop capacity (rules in the module docstring); ``max_probes`` None: ``probes_needed`` at
    ``resolution`` (``within_resolution``); ``limit`` names what set ``maximum``."""
    if resolution < 0:
        raise ValueError(f"the concurrency search's resolution must not be negative, not {resolution}")
    s = Search("concurrency", limit=limit)
    if known_pass or known_fail is not None:
        s.seeded = {"pass": known_pass, **({"fail": known_fail} if known_fail is not None else {})}
    budget = max_probes if max_probes is not None else probes_needed(start, maximum, resolution)
    passed, failed = _bisect_concurrency(probe, s, start, maximum, budget, known_pass, known_fail, resolution)
    if recheck:
        for c, first in ((passed, True), (failed, False)):
            if c is not None and 0 < c <= maximum:
                s.rechecks.append((c, probe(c), first))
    s.capacity, s.fail = float(passed), None if failed is None else float(failed)
    return s


def search_rate(probe: Callable[[float], Verdict], start: float, max_probes: int, resolution: float = 0.1) -> Search:
    s = Search("rate")
    passed, failed = 0.0, math.inf
    rate = start
    while len(s.probes) < max_probes:
        v = probe(rate)
        s.probes.append((rate, v))
        if v.passed:
            passed = max(passed, rate)
        else:
            failed = min(failed, rate)
        if passed > 0 and failed < math.inf and failed / passed <= 1.0 + resolution:
            s.converged = True
            break
        if failed == math.inf:
            rate = passed * RATE_STEP
        elif passed == 0.0:
            rate = failed / RATE_STEP
        else:
            rate = math.sqrt(passed * failed)
    s.capacity, s.fail = passed, None if failed == math.inf else failed
    return s
