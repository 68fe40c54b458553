"""How many client workers a cell needs (``load.client.workers: auto``): one, until the server's own cells show
that one worker's loop would be busy for more than ``WORKER_SHARE`` of a core.

Why from measurements: a worker's cost is CPU-seconds per 1k streamed tokens, nearly constant for one client
and machine (0.033-0.039 on an H100 node against vLLM, 2026-12-06), so the workers a cell needs follow from the
token rate it will stream. That rate is not known before the cell, but a closed loop's output rate is at most
proportional to its concurrency from any lower one (a server's rate per request in flight does not rise as more
are added) and does not fall as concurrency rises; so every cell seen on the same server bounds the next one's
rate, and the tightest of those bounds is taken.

Why one worker before any cell, and why the tightest bound: on an H100 node (runs/h100-capacity-steady-2026-12-07,
c=256, three rounds against ``vllm bench serve``) one worker read within 3 % in every round, at 0.35-0.39 of a
core; runs with 3 or 4 workers read 6-15 % fewer tokens a second in four of six, while the server's own
inter-token latency did not move. A client with more workers than it needs is not a safe default, and a client
that one worker cannot carry is caught by its health check (bakeoff.loadgen.health), which runs the cell again
with twice the workers. The half core comes from benchmarks/client_saturation.py (the table in
bakeoff.loadgen.health): one worker's TPOT stayed at the server's up to about half a core and drifted above it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

WORKER_SHARE = 0.5  # a worker is planned at half a core at most, so that a burst still finds it idle


@dataclass(frozen=True)
class Seen:
    """One cell measured on the server: its concurrency, output rate, the client's CPU cost, the workers it was
    shown to need (more than one only where fewer were short and it was run again with these), and whether the
    client was short with the workers it ended with (``saturated``)."""

    concurrency: int
    tok_s: float
    cpu_s_per_1k: float
    needed: int = 1
    workers: int = 1
    saturated: bool = False


@dataclass
class ClientSizer:
    """The cells measured on one server so far, and the worker counts they imply for the next."""

    seen: list[Seen] = field(default_factory=list)

    def observe(self, concurrency: int, output_tok_s: float | None, cpu_s_per_1k: float | None, *, needed: int = 1,
                workers: int = 1, saturated: bool = False) -> None:
        """A measured cell (:class:`Seen`); one without a rate or a cost teaches nothing."""
        if output_tok_s and cpu_s_per_1k and not math.isnan(output_tok_s) and not math.isnan(cpu_s_per_1k):
            self.seen.append(Seen(max(concurrency, 1), float(output_tok_s), float(cpu_s_per_1k), max(needed, 1),
                                  max(workers, 1), saturated))

    def floor(self, concurrency: int) -> int:
        """The fewest workers a cell at ``concurrency`` may start with: as many as a cell at this concurrency or
        below was shown to need, and twice as many as one was still short with. A short client's rate is its own,
        not the server's, so the rate bound alone would start the next cell short again."""
        return max((max(s.needed, 2 * s.workers if s.saturated else 1) for s in self.seen
                    if s.concurrency <= concurrency), default=1)

    def expected_tok_s(self, concurrency: int) -> float | None:
        """The tightest upper bound on the output rate at ``concurrency`` from the cells seen (module docstring);
        None before any."""
        bounds = [s.tok_s * concurrency / s.concurrency if s.concurrency <= concurrency else s.tok_s for s in self.seen]
        return min(bounds) if bounds else None

    def cost(self) -> float | None:
        """CPU-seconds per 1k tokens: the highest seen on this server (the cautious one); None before any."""
        return max((s.cpu_s_per_1k for s in self.seen), default=None)

    def workers(self, concurrency: int, cores: int) -> int:
        """The workers ``auto`` picks for a cell of ``concurrency`` requests in flight: one before any cell."""
        rate, cost = self.expected_tok_s(concurrency), self.cost()
        need = math.ceil(rate * cost / 1000.0 / WORKER_SHARE) if rate is not None and cost is not None else 1
        return max(1, min(max(need, self.floor(concurrency)), cores, concurrency))
