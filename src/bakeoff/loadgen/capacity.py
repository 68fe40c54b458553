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
* **Early stop.** Once more requests have exceeded a bound (or failed) than the p99 can absorb, that is
  ``n - floor(0.99 (n - 1))`` of ``n``, both order statistics the p99 interpolates between are over the
  bound: the probe has failed whatever the rest do. It stops sending; requests in flight finish.
* **Concurrency search (closed loop).** From ``start``, double until a probe fails or ``maximum`` passes
  (the bracket), then bisect between the highest pass and the lowest fail until they are adjacent.
* **Rate search (open loop, Poisson arrivals, no cap on requests in flight).** From ``start`` (the
  closed-loop capacity's request rate), multiply or divide by ``RATE_STEP`` until a pass and a fail
  bracket the capacity, then bisect geometrically until ``fail / pass <= 1 + resolution``.
* Each search stops after ``max_probes`` probes; its result says whether it converged.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from bakeoff.config.slo import SLO_PRESETS, Slo
from bakeoff.loadgen.metrics import RequestRecord

__all__ = ["SLO_PRESETS", "Slo", "EarlyStop", "Search", "Verdict", "judge", "search_concurrency", "search_rate"]

RATE_STEP = 1.5


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
    violations: int = 0

    def __call__(self, record: RequestRecord) -> bool:
        self.violations += bool(over(record, self.slo))
        return self.violations >= violation_limit(self.n)


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

    @property
    def binding(self) -> str:
        """What bound the lowest failing probe exceeded ('' where none failed)."""
        fails = sorted((v, d) for v, d in self.probes if not d.passed)
        return "+".join(fails[0][1].exceeded) if fails else ""


def search_concurrency(probe: Callable[[int], Verdict], start: int, maximum: int, max_probes: int) -> Search:
    s = Search("concurrency")
    seen: dict[int, Verdict] = {}

    def run(c: int) -> Verdict:
        if c not in seen:
            seen[c] = probe(c)
            s.probes.append((c, seen[c]))
        return seen[c]

    passed, failed = 0, None
    c = max(1, min(start, maximum))
    while len(seen) < max_probes:
        if run(c).passed:
            passed = max(passed, c)
        else:
            failed = c if failed is None else min(failed, c)
        if failed is None:  # bracketing upwards
            if c >= maximum:
                s.at_limit = s.converged = True
                break
            c = min(2 * c, maximum)
            continue
        if failed - passed <= 1:
            s.converged = True
            break
        c = (passed + failed) // 2  # bisect (with no pass yet: halve, bracketing downwards)
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
