"""Latency SLOs that a capacity search can be asked to meet, by name.

Why named presets: a capacity means nothing without its bound, and a published one (MLPerf's) lets a
reader compare. The bounds are p99s in milliseconds (bakeoff.loadgen.capacity judges them).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Slo:
    """p99 bounds, in milliseconds."""

    name: str
    ttft_ms: float
    tpot_ms: float

    def bounds(self) -> dict[str, float]:
        return {"ttft": self.ttft_ms, "tpot": self.tpot_ms}


# MLPerf Inference's Llama-3.1-8B latency limits (its server and interactive scenarios), and one scaled to
# what the embedded 135M model on a 2-core CPU meets at a few concurrent users.
SLO_PRESETS = {
    "server": Slo("server", 2000.0, 100.0),
    "interactive": Slo("interactive", 500.0, 30.0),
    "cpu": Slo("cpu", 1000.0, 100.0),
}
