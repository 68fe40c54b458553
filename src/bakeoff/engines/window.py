"""What a load cell records besides the client's view, over exactly its measured window.

One object starts the GPU telemetry (bakeoff.hardware.telemetry), the server-metrics scrape
(bakeoff.loadgen.scrape), the prefix-cache counters (bakeoff.loadgen.prefix_cache) and the server's latency
histograms (bakeoff.loadgen.server_latency) right before the first measured request and stops them right after
the last, so warm-up and model load never enter the energy, utilization, queue peaks, cache hits or the server's
latency means. The serve-load stage wires it to the load runner's window hooks and merges
:meth:`MeasuredWindow.columns` into the cell's record.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bakeoff.engines.base import Engine
from bakeoff.hardware.telemetry import GpuWindow
from bakeoff.loadgen.prefix_cache import PrefixCacheWindow
from bakeoff.loadgen.scrape import MetricsScraper
from bakeoff.loadgen.server_latency import ServerLatencyWindow


@dataclass
class MeasuredWindow:
    engine: Engine
    gpu: bool
    gpu_window: GpuWindow | None = None
    scraper: MetricsScraper | None = None
    prefix_cache: PrefixCacheWindow | None = None
    latency: ServerLatencyWindow | None = None
    notes: list[str] = field(default_factory=list)

    def start(self) -> None:
        spec = self.engine.spec
        self.scraper = MetricsScraper(self.engine.base_url, self.engine.metric_names, spec.engine.api_key,
                                      label=self.engine.name).start()
        self.prefix_cache = PrefixCacheWindow(self.engine.base_url, self.engine.prefix_cache_counters,
                                              spec.engine.api_key, label=self.engine.name)
        self.prefix_cache.open()
        self.latency = ServerLatencyWindow(self.engine.base_url, self.engine.latency_histograms, spec.engine.api_key,
                                           label=self.engine.name)
        self.latency.open()
        if self.gpu:
            self.gpu_window = GpuWindow(self.engine.env()).start()  # the server's own GPUs, as it was started

    def stop(self) -> None:
        if self.gpu_window is not None:
            self.gpu_window.stop()
        if self.scraper is not None:
            self.scraper.stop()
        if self.prefix_cache is not None:
            self.prefix_cache.close()
        if self.latency is not None:
            self.latency.close()

    def columns(self, output_tokens: int | None, prompt_tokens: int | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.scraper is not None:
            out.update(self.scraper.columns())
        if self.prefix_cache is not None:
            out.update(self.prefix_cache.columns(prompt_tokens))
        if self.latency is not None:
            out.update(self.latency.columns())
        if self.gpu_window is not None:
            out.update(self.gpu_window.columns(output_tokens))
        return out
