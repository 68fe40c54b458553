"""The capacity search: the highest load one variant serves while its p99 latencies meet an SLO.

Why a search: fixed concurrency points leave the question a user asks ("how many users within my latency
target?") to the reader. Peers search too (`vllm bench sweep serve_sla`, AIPerf, MLPerf's server
scenario), each for one engine; here every engine is probed by the same client and judged by one rule.

The rules, stated once:

* **Verdict.** A probe passes when every request succeeded and its p99 TTFT and p99 TPOT (numpy's
  interpolated 99th percentile, as in every cell) are at or under the SLO's bounds.
* **Probe length.** ``max(min_requests, waves x c)`` measured requests, after ``c`` uncounted warm-up
  requests. With fewer than 100 requests a p99 lies near the slowest request, so a short probe errs
  towards failing, never towards passing.
* **Early stop (per bound).** Violations are counted per bound. Once one bound's count reaches
  ``n - floor(0.99 (n - 1))`` of ``n``, both order statistics that bound's p99 interpolates between are over
  it: the probe has failed whatever the rest do. A failed request fails the probe at once. A request over
  TTFT only and another over TPOT only are one violation of each bound, not two of one. The probe stops
  sending; requests in flight finish.
* **Concurrency search (closed loop).** The bracket starts from what the variant's fixed cells showed at
  the same prompt length: the highest concurrency that met the SLO below the lowest that failed is a known
  pass, that lowest fail a known fail. From there (else from ``start``) it doubles until a probe fails or
  ``maximum`` passes, then bisects between the highest pass and the lowest fail until they are adjacent.
  The default probe budget is the most probes this needs for any capacity in ``0..maximum``
  (``probes_needed``), so the search always converges.
* **Boundary re-check.** A probe near the capacity can pass or fail by chance, and one noisy fail sends a
  bisection down for good. At the end the highest pass and the lowest fail are each probed once more;
  where either run disagrees with the first, the capacity is reported as uncertain, with both results.
* **Rate search (open loop, Poisson arrivals, no cap on requests in flight).** From ``start`` (the
  closed-loop capacity's request rate), multiply or divide by ``RATE_STEP`` until a pass and a fail
  bracket the capacity, then bisect geometrically until ``fail / pass <= 1 + resolution``.
* **Limits.** The search never probes past ``maximum``: the search's own ceiling
  (``load.capacity.max_concurrency``) or the server's limit where that is lower (vLLM's ``max_num_seqs`` or its
  KV cache, llama.cpp's slots; bakeoff.stages.serve_capacity.search_limit), named in ``limit``. A search whose
  probe at that maximum passed found a lower bound, not a capacity: it is never reported as converged.
* A search that hits its ``max_probes`` says it did not converge; its capacity is then a lower bound.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from bakeoff.config.slo import SLO_PRESETS, Slo
from bakeoff.loadgen.metrics import RequestRecord

__all__ = ["SLO_PRESETS", "Slo", "EarlyStop", "Search", "Verdict", "bracket_from_cells", "judge", "probes_needed",
           "search_concurrency", "search_rate"]

RATE_STEP = 1.5
RATE_PROBES = 8  # the rate search's budget where none is configured


def violation_limit(n: int) -> int:
    """Requests over a bound that make the p99 of ``n`` certainly over it (see the module's early-stop rule)."""
    return n - math.floor(0.99 * (n - 1))


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
    violations: Counter[str] = field(default_factory=Counter)  # per bound ("ttft", "tpot"; "failed")

    def __call__(self, record: RequestRecord) -> bool:
        self.violations.update(over(record, self.slo))
        if self.violations["failed"]:
            return True
        limit = violation_limit(self.n)
        return any(count >= limit for bound, count in self.violations.items() if bound != "failed")


@dataclass(frozen=True)
class Verdict:
    passed: bool
    exceeded: tuple[str, ...] = ()  # the bounds the probe's p99s exceeded, or "failed" requests
    stopped_early: bool = False


def judge(metrics: Mapping[str, Any], slo: Slo, stopped_early: bool = False) -> Verdict:
    """A probe's verdict from its cell metrics (``summarize``'s keys)."""
    exceeded = [k for k, bound in slo.bounds().items()
                if not (metrics.get(f"p99_{k}_ms") is not None and metrics[f"p99_{k}_ms"] <= bound)]
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
    at_limit: bool = False  # the highest load allowed passed: capacity is at least this
    limit: str = "search maximum"  # what set the highest load allowed (module docstring: Limits)
    seeded: dict[str, int] = field(default_factory=dict)  # {"pass": c, "fail": c} taken from the fixed cells
    rechecks: list[tuple[float, Verdict, bool]] = field(default_factory=list)  # (load, re-run verdict, first passed)

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


def _bisect_concurrency(probe: Callable[[int], Verdict], s: Search, start: int, maximum: int, budget: int,
                        known_pass: int, known_fail: int | None) -> tuple[int, int | None]:
    seen: dict[int, Verdict] = {}
    passed = min(known_pass, maximum)
    failed = known_fail if known_fail is not None and known_fail <= maximum and known_fail > passed else None
    if passed >= maximum:
        s.at_limit = True
        return passed, failed
    if failed is not None and failed - passed <= 1:
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
        if failed - passed <= 1:
            s.converged = True
            break
        c = (passed + failed) // 2  # bisect (with no pass yet: halve, bracketing downwards)
    return passed, failed


def probes_needed(start: int, maximum: int) -> int:
    """The most probes the concurrency search takes, without seeds, over every true capacity in 0..maximum."""
    worst = 0
    for truth in range(maximum + 1):
        s = Search("concurrency")
        _bisect_concurrency(lambda c, t=truth: Verdict(c <= t), s, start, maximum, maximum + 1, 0, None)
        worst = max(worst, len(s.probes))
    return worst


def search_concurrency(probe: Callable[[int], Verdict], start: int, maximum: int, max_probes: int | None = None,
                       known_pass: int = 0, known_fail: int | None = None, recheck: bool = True,
                       limit: str = "search maximum") -> Search:
    """The closed-loop capacity (rules in the module docstring); ``max_probes`` None: ``probes_needed``;
    ``limit`` names what set ``maximum``."""
    s = Search("concurrency", limit=limit)
    if known_pass or known_fail is not None:
        s.seeded = {"pass": known_pass, **({"fail": known_fail} if known_fail is not None else {})}
    budget = max_probes if max_probes is not None else probes_needed(start, maximum)
    passed, failed = _bisect_concurrency(probe, s, start, maximum, budget, known_pass, known_fail)
    if recheck:
        for c, first in ((passed, True), (failed, False)):
            if c is not None and 0 < c <= maximum:
                s.rechecks.append((c, probe(c), first))
    s.capacity = float(passed)
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
    s.capacity = passed
    return s
