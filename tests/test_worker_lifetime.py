"""Load workers die with their cell (bakeoff.loadgen.workers.die_with_parent, run_processes).

A child Python process runs a long two-worker cell against the echo server, as a stage would; once both workers
stream, the child is killed (SIGKILL: nothing of it runs again) or sent SIGTERM (its handler raises, as a
stage's does, and it lives on to stop its server). Its worker processes, and where it died multiprocessing's
resource tracker, must be gone within a second. The processes are found by their command lines among the
child's descendants before the signal, so one re-parented to init is still watched.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from bakeoff.loadgen.echo_server import InFlight, serving

CELL = """
import signal, sys, time
from bakeoff.loadgen.cellload import CellLoad
from bakeoff.loadgen.runner import run_cell

class Stop(BaseException):
    pass

def on_term(*_):
    raise Stop()

signal.signal(signal.SIGTERM, on_term)
try:
    run_cell(sys.argv[1], "m", CellLoad([f"p {i}" for i in range(100000)], 2, 64, concurrency=8),
             show_progress=False, workers=2)
except Stop:
    time.sleep(60)  # a stage goes on stopping its server: its workers must not wait for that
"""
C = 8


def _descendants(pid: int) -> tuple[list[psutil.Process], list[psutil.Process]]:
    """The cell's worker processes and resource trackers under ``pid``."""
    kids = psutil.Process(pid).children(recursive=True)
    cmd = {k.pid: " ".join(k.cmdline()) for k in kids}
    trackers = [k for k in kids if "resource_tracker" in cmd[k.pid]]
    workers = [k for k in kids if "spawn_main" in cmd[k.pid]]
    return workers, trackers


def _running(procs: list[psutil.Process]) -> list[psutil.Process]:
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["sigkill", "sigterm"])
def test_a_cells_workers_are_gone_within_a_second_of_its_process_being_killed_or_stopped(sig: int) -> None:
    server = InFlight()
    with serving(token_delay_s=0.005, middlewares=[server.middleware()]) as url:
        child = subprocess.Popen([sys.executable, "-c", CELL, url], env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            deadline = time.monotonic() + 60
            while True:  # until both workers stream the cell's c requests
                assert child.poll() is None and time.monotonic() < deadline, "the cell never got going"
                workers, trackers = _descendants(child.pid)
                if len(workers) == 2 and trackers and server.now == C:
                    break
                time.sleep(0.05)
            watched = workers + trackers if sig == signal.SIGKILL else workers
            t = time.monotonic()
            os.kill(child.pid, sig)
            while _running(watched) and time.monotonic() - t < 1.0:
                time.sleep(0.02)
            left = [(p.pid, " ".join(p.cmdline())[-80:]) for p in _running(watched)]
            assert left == [], left
            if sig == signal.SIGTERM:
                assert child.poll() is None  # the stage itself lives on: its workers did not wait for it
            time.sleep(0.3)  # and nothing sends more: the server's streams all ended
            assert server.now == 0
        finally:
            child.kill()
            child.wait(10)


# The same cell in the stage's own process (one worker: uvloop's loop in the main thread), as most cells run.
CELL_IN_PROCESS = (CELL.replace("workers=2", "workers=1")
                   .replace("    time.sleep(60)", "    print('stopped', flush=True)\n    time.sleep(60)"))


def test_a_stages_sigterm_ends_a_cell_run_in_its_own_process_at_once() -> None:
    """uvloop only logs what a signal handler raises; without bakeoff.loadgen.workers.signals_end_the_cell the cell
    ran on after the stage's SIGTERM (measured: still streaming 40 s later), and a cancelled Slurm job's stage
    wrote a "server died mid-cell" record once its server had stopped."""
    server = InFlight()
    with serving(token_delay_s=0.005, middlewares=[server.middleware()]) as url:
        child = subprocess.Popen([sys.executable, "-c", CELL_IN_PROCESS, url], stdout=subprocess.PIPE, text=True,
                                 env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            deadline = time.monotonic() + 60
            while server.now < C:
                assert child.poll() is None and time.monotonic() < deadline, "the cell never got going"
                time.sleep(0.05)
            t = time.monotonic()
            os.kill(child.pid, signal.SIGTERM)
            while server.now and time.monotonic() - t < 1.0:
                time.sleep(0.02)
            assert server.now == 0, f"{server.now} requests still streaming 1 s after the stage's SIGTERM"
            assert child.poll() is None  # the handler's exception reached the stage, which lives on to stop
        finally:
            child.kill()
            out, _ = child.communicate(timeout=10)
        assert "stopped" in out, out
