"""What a load cell records besides the client's view, over exactly its measured window.

One object starts the GPU telemetry (bakeoff.hardware.telemetry), the server-metrics scrape
(bakeoff.loadgen.scrape), the prefix-cache counters (bakeoff.loadgen.prefix_cache), the server's latency
histograms (bakeoff.loadgen.server_latency) and the watch on the server's threads and the client's cores
(bakeoff.loadgen.core_watch) right before the first measured request and stops them right after the last, so
warm-up and model load never enter the energy, utilization, queue peaks, cache hits, the server's latency means
or its CPU. The serve-load stage wires it to the load runner's window hooks and merges
:meth:`MeasuredWindow.columns` into the cell's record.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from bakeoff.engines.base import Engine
from bakeoff.hardware.telemetry import GpuWindow
from bakeoff.loadgen.core_watch import CoreWatch, unwatched
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
    cores: CoreWatch | None = None
    unwatched_reason: str = ""
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
        self.unwatched_reason = self.unwatchable()
        if not self.unwatched_reason:
            self.cores = CoreWatch(self.engine.pid() or 0).__enter__()

    def unwatchable(self) -> str:
        """Why the server's threads cannot be watched from here ("" where they can): in a container its
        processes are not this machine's children to find; in this process they are the client's own."""
        if self.engine.container is not None:
            return "the server runs in a container"
        pid = self.engine.pid()
        if pid is None or pid == os.getpid():
            return "the server runs in the measuring process"
        return ""

    def stop(self) -> None:
        if self.gpu_window is not None:
            self.gpu_window.stop()
        if self.scraper is not None:
            self.scraper.stop()
        if self.prefix_cache is not None:
            self.prefix_cache.close()
        if self.latency is not None:
            self.latency.close()
        if self.cores is not None:
            self.cores.__exit__(None, None, None)

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
        if self.cores is not None:
            out.update(self.cores.columns())
        elif self.unwatched_reason:
            out.update(unwatched(self.unwatched_reason))
        return out
