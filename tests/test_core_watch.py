"""bakeoff.loadgen.core_watch against processes whose placement is known: pinned with sched_setaffinity."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import psutil
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


def cpu_s(pid: int) -> float:
    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


@needs_two
def test_a_client_on_the_servers_core_overlaps_it_and_the_shares_are_the_kernels_cpu_time() -> None:
    assert pair is not None
    a, b = pair
    with spinning(a) as server:
        with spinning(a) as client, CoreWatch(server, interval_s=0.05) as same:  # the client's spinner is this process's child
            c0, s0, name = cpu_s(client), cpu_s(server), psutil.Process(server).name()
            time.sleep(1.5)
            c1, s1 = cpu_s(client), cpu_s(server)
        with spinning(b), CoreWatch(server, interval_s=0.05) as apart:
            time.sleep(1.5)
    s, p = same.summary(), apart.summary()
    assert s["core_watch_intervals"] >= 20 and p["core_watch_intervals"] >= 20
    assert s["core_overlap_share"] > 0.7 and p["core_overlap_share"] < 0.1, (s, p)
    # the shares are the kernel's CPU time over the window, whatever else the machine runs
    (server_share,) = s["server_cpu_share_by_process"].values()
    assert server_share * s["core_watch_s"] == pytest.approx(s1 - s0, abs=0.1)
    assert s["client_cpu_share_total"] * s["core_watch_s"] == pytest.approx(c1 - c0, abs=0.1)
    assert server_share + s["client_cpu_share_total"] < 1.15  # one core between them
    cols = same.columns()  # a cell's columns: the spinner is the server's one busy thread
    assert cols["server_busiest_thread"].startswith(f"{name}[{server}]/python")
    assert cols["server_busiest_thread_cpu_share"] == pytest.approx(server_share, abs=0.02)
    assert cols["server_cpu_cores"] == pytest.approx(server_share, abs=0.02)
    assert cols["client_server_core_overlap_share"] == s["core_overlap_share"]


def test_a_server_that_is_gone_leaves_the_watch_empty_not_failed() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    with CoreWatch(proc.pid, interval_s=0.02) as w:
        time.sleep(0.1)
    out = w.summary()
    assert out["server_cpu_share_by_process"] == {} and out["core_watch_intervals"] >= 2
    assert out["core_overlap_share"] == 0.0
    cols = w.columns()
    assert cols["server_cpu_cores"] is None and cols["core_watch_source"].startswith("none: no server thread seen")


def test_a_client_check_run_against_the_echo_server_shows_the_servers_busiest_thread() -> None:
    """The check's path (benchmarks/client_vs_vllm_bench.py): a run watched, then its row in a record's README."""
    from bakeoff.loadgen.cellload import CellLoad
    from bakeoff.loadgen.echo_server import own_process
    from bakeoff.loadgen.metrics import summarize
    from bakeoff.loadgen.runner import run_cell
    from bakeoff.node.readme import client_check_section

    with own_process(1.0) as (url, pid), CoreWatch(pid, interval_s=0.05) as watch:
        res = run_cell(url, "m", CellLoad([f"p {i}" for i in range(256)], 2, 64, concurrency=64), show_progress=False)
    run = {**summarize(res.records, res.duration_s), **res.client, **watch.summary(), **watch.columns(),
           "concurrency": 64, "round": 0, "position": 0}
    assert f"[{pid}]/" in run["server_busiest_thread"]  # the echo server's process, not the client's
    assert 0 < run["server_busiest_thread_cpu_share"] <= run["server_cpu_cores"] + 1e-9
    row = next(line for line in client_check_section({"runs": {"bakeoff:1": [run]}}) if line.startswith("| 64 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[-2] == f"{run['server_busiest_thread_cpu_share']:.2f} ({run['server_busiest_thread']})"
    assert cells[-1] == f"{run['client_server_core_overlap_share']:.2f}"
