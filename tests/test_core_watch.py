"""bakeoff.loadgen.core_watch against processes whose placement is known: pinned with sched_setaffinity."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from bakeoff.loadgen.core_watch import CoreWatch, physical_cores

SPIN = [sys.executable, "-c", "while True: pass"]


@contextmanager
def spinning(cpu: int) -> Iterator[int]:
    """A process that burns one CPU, pinned to ``cpu``; killed on exit."""
    proc = subprocess.Popen(SPIN)
    try:
        os.sched_setaffinity(proc.pid, {cpu})
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


def two_physical_cores() -> tuple[int, int] | None:
    """Two CPUs of this process's affinity on different physical cores (not hyperthread siblings), if any."""
    cores = physical_cores()
    mine = sorted(os.sched_getaffinity(0))
    for a in mine:
        for b in mine:
            if cores.get(a) != cores.get(b):
                return a, b
    return None


pair = two_physical_cores()
needs_two = pytest.mark.skipif(pair is None, reason="needs two CPUs on different physical cores")


@needs_two
def test_a_client_on_the_servers_core_overlaps_it_and_halves_its_share() -> None:
    assert pair is not None
    a, b = pair
    with spinning(a) as server:
        with spinning(a), CoreWatch(server) as same:  # the client's spinner is this process's child
            time.sleep(1.5)
        with spinning(b), CoreWatch(server) as apart:
            time.sleep(1.5)
    s, p = same.summary(), apart.summary()
    assert s["core_watch_intervals"] >= 20 and p["core_watch_intervals"] >= 20
    assert s["core_overlap_share"] > 0.7 and p["core_overlap_share"] < 0.1, (s, p)
    (shared,), (alone,) = s["server_cpu_share_by_process"].values(), p["server_cpu_share_by_process"].values()
    assert shared == pytest.approx(0.5, abs=0.15) and alone == pytest.approx(1.0, abs=0.15)
    assert s["client_cpu_share_total"] == pytest.approx(0.5, abs=0.15)
    assert p["client_cpu_share_total"] == pytest.approx(1.0, abs=0.15)


def test_a_server_that_is_gone_leaves_the_watch_empty_not_failed() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    with CoreWatch(proc.pid, interval_s=0.02) as w:
        time.sleep(0.1)
    out = w.summary()
    assert out["server_cpu_share_by_process"] == {} and out["core_watch_intervals"] >= 2
    assert out["core_overlap_share"] == 0.0
