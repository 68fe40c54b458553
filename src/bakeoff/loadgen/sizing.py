"""How many client workers a cell needs (``load.client.workers: auto``).

Why from measurements: a worker's cost is CPU-seconds per 1k streamed tokens, nearly constant for one client
and machine (0.033-0.039 on an H100 node against vLLM, 2026-12-06), so the workers a cell needs follow from the
token rate it will stream. That rate is not known before the cell, but a server's output rate grows at most in
proportion to its concurrency, so the fastest cell seen so far on the same server, scaled by ``c / c_seen``,
bounds it from above. Before any cell has run, each request is assumed to stream at ``STREAM_TOK_S`` (2 ms a
token, faster than any single stream measured here). The count is then the expected CPU over
``WORKER_SHARE`` of a core each, bounded by the cores this process may use and by the concurrency.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

DEFAULT_CPU_S_PER_1K = 0.04  # before a cell on this server measured it: the H100 node's figure, rounded up
STREAM_TOK_S = 500.0  # an unmeasured server's assumed tokens a second per request in flight
WORKER_SHARE = 0.5  # each worker is planned at half a core, so that a burst still finds it idle


@dataclass
class ClientSizer:
    """The cells measured on one server so far, and the worker counts they imply for the next."""

    seen: list[tuple[int, float, float]] = field(default_factory=list)  # (concurrency, output tok/s, CPU-s/1k)

    def observe(self, concurrency: int, output_tok_s: float | None, cpu_s_per_1k: float | None) -> None:
        if output_tok_s and cpu_s_per_1k and not math.isnan(output_tok_s) and not math.isnan(cpu_s_per_1k):
            self.seen.append((max(concurrency, 1), float(output_tok_s), float(cpu_s_per_1k)))

    def expected_tok_s(self, concurrency: int) -> float:
        """An upper bound on the output rate at ``concurrency`` (module docstring)."""
        if not self.seen:
            return concurrency * STREAM_TOK_S
        return max(rate * concurrency / max(c, 1) if c <= concurrency else rate for c, rate, _ in self.seen)

    def cost(self) -> float:
        """CPU-seconds per 1k tokens: the highest seen on this server (the cautious one), or the default."""
        return max((cost for _, _, cost in self.seen), default=DEFAULT_CPU_S_PER_1K)

    def workers(self, concurrency: int, cores: int) -> int:
        """The workers ``auto`` picks for a cell of ``concurrency`` requests in flight."""
        need = self.expected_tok_s(concurrency) * self.cost() / 1000.0 / WORKER_SHARE
        return max(1, min(math.ceil(need), cores, concurrency))
