"""The server's own latency means over a cell's measured window, from its Prometheus histograms.

Why: the client times a first token when it arrives; the server's histograms time it where the server hands it
out. Where the client's TTFT is far above the server's, the time went between them (the server's output path,
the network, the client); where they agree, in the server (its queue, its steps). A capacity probe whose TTFT
swings with no request waiting (runs/h100-capacity-steady-2026-12-07) needs exactly this split. Each engine plugin
names its histograms (``Engine.latency_histograms``), read at the window's start and end; each mean is the
window's sum over its count:

* **vLLM** ``vllm:time_to_first_token_seconds``, ``vllm:inter_token_latency_seconds`` and
  ``vllm:request_queue_time_seconds`` (arrival to first scheduling).
* **llama-server** keeps no histograms on ``/metrics``: no columns (its per-request ``timings`` are read instead,
  ``server_median_prompt_ms``).

The window is the cell's (bakeoff.engines.window): a ramped cell's ramp is in it, so these are whole-cell means.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bakeoff.loadgen.scrape import metrics_page

COLUMNS = ["server_mean_ttft_ms", "server_mean_itl_ms", "server_mean_queue_ms", "server_latency_requests",
           "server_latency_source"]


@dataclass(frozen=True)
class LatencyHistograms:
    """An engine's Prometheus histogram names (without ``_sum`` / ``_count``), in seconds."""

    ttft: str
    itl: str | None = None
    queue: str | None = None

    def by_column(self) -> dict[str, str]:
        named = {"server_mean_ttft_ms": self.ttft, "server_mean_itl_ms": self.itl, "server_mean_queue_ms": self.queue}
        return {k: v for k, v in named.items() if v}


def window_means(before: dict[str, float], after: dict[str, float], names: dict[str, str]) -> dict[str, float | None]:
    """Each named histogram's mean over the window, in ms: (sum after - sum before) / (count after - count
    before); None where nothing was observed in it."""
    out: dict[str, float | None] = {}
    for column, name in names.items():
        n = after.get(name + "_count", 0.0) - before.get(name + "_count", 0.0)
        out[column] = 1000 * (after.get(name + "_sum", 0.0) - before.get(name + "_sum", 0.0)) / n if n > 0 else None
    return out


@dataclass
class ServerLatencyWindow:
    """The histograms read at the window's start and end; a read that fails is said, never fatal."""

    base_url: str
    histograms: LatencyHistograms | None
    api_key: str | None = None
    label: str = ""
    start: dict[str, float] | None = None
    end: dict[str, float] | None = None
    error: str = ""

    def _read(self) -> dict[str, float] | None:
        page, err = metrics_page(self.base_url, self.api_key)
        self.error = err or self.error  # a failed read's reason outlives a later read that worked
        if page is not None and self.histograms is not None and self.histograms.ttft + "_count" not in page:
            self.error = f"no {self.histograms.ttft} on /metrics"
            return None
        return page

    def open(self) -> None:
        if self.histograms is not None:
            self.start = self._read()

    def close(self) -> None:
        if self.histograms is not None:
            self.end = self._read()

    def columns(self) -> dict[str, Any]:
        """The cell's server-latency columns (empty for an engine that names no histograms)."""
        if self.histograms is None:
            return {}
        names = self.histograms.by_column()
        if self.start is None or self.end is None:
            return {**dict.fromkeys(names), "server_latency_requests": None,
                    "server_latency_source": f"{self.label} /metrics (unavailable: {self.error})".lstrip()}
        count = self.histograms.ttft + "_count"
        return {**window_means(self.start, self.end, names),
                "server_latency_requests": int(self.end.get(count, 0.0) - self.start.get(count, 0.0)),
                "server_latency_source": f"{self.label} /metrics".lstrip()}
