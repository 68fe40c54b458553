"""Peak memory of a running server: process-tree RSS (psutil) and GPU memory (nvidia-ml-py).

Sampled in a background thread, because the peak happens during load, not at
start. ``reset()`` starts a new window so each load cell gets its own peak.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable

import psutil


def tree_rss(pid: int) -> int:
    """Resident bytes of a process and all its descendants."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            total += p.memory_info().rss
    return total


def gpu_used_bytes() -> int | None:
    """Device memory in use across visible GPUs, or None without NVIDIA GPUs."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no driver / library: not a GPU machine
        return None
    try:
        return sum(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(i)).used
                   for i in range(pynvml.nvmlDeviceGetCount()))
    finally:
        pynvml.nvmlShutdown()


class PeakSampler:
    def __init__(self, pid: int, interval_s: float = 0.25, gpu: bool = False,
                 sample: Callable[[], int | None] | None = None) -> None:
        """``sample`` reads the server's memory (a container's cgroup); default: ``pid``'s process tree RSS."""
        self.pid = pid
        self.sample = sample or (lambda: tree_rss(pid))
        self.interval_s = interval_s
        self.gpu = gpu
        self.peak_rss = 0
        self.peak_gpu: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak_rss = max(self.peak_rss, self.sample() or 0)
            if self.gpu:
                used = gpu_used_bytes()
                if used is not None:
                    self.peak_gpu = max(self.peak_gpu or 0, used)
            self._stop.wait(self.interval_s)

    def reset(self) -> None:
        self.peak_rss = self.sample() or 0
        self.peak_gpu = None

    def __enter__(self) -> PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
