"""Who ran where while a client drove a server on the same machine: each side's CPU, and how often they shared a core.

Why: on a GPU node the client and the server's own processes (vLLM's API server, which streams every token to
the client, and its engine core) share the node's cores. Where a client process runs on the physical core of a
busy server thread (the same CPU, or its hyperthread sibling), that thread runs slower, and the server delivers
tokens later than its engine made them, which the client reads as a slower server while the server's own
latency histograms do not move. Whether that happened in a run is a question of placement, which the kernel
decides and reports per thread (``/proc/<pid>/task/<tid>/stat``: CPU time and the CPU it last ran on).
psutil reads a process's last CPU but not a thread's, so the threads' lines are read here.

A thread is *busy* in a sample interval where it used at least ``BUSY_SHARE`` of the interval's CPU time.
The overlap is the share of intervals in which a busy client thread and a busy server thread ran on one physical
core. The busiest server thread's share of one core says whether one thread of the server (vLLM's API server is
one Python thread streaming every token) was the limit.

The watch runs in the measuring process, where a one-worker client's event loop runs too, so it is kept cheap:
it reads every thread's line each ``INTERVAL_S`` and looks for new processes every ``TREE_EVERY`` samples.
Measured on the 2-core development machine: 2.6 ms to read 150 threads, 1.3 ms to list two process trees, so
under 1 % of one core at these settings. An interval that long sees where threads stayed, which is the placement
that slows a server; the kernel moves threads between shorter ones anyway.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

BUSY_SHARE = 0.25  # a thread that used a quarter of an interval's time ran there long enough to slow a sibling
INTERVAL_S = 0.5
TREE_EVERY = 4  # samples between two listings of the process trees (a listing reads every process on the machine)
COLUMNS = ["server_cpu_cores", "server_busiest_thread_cpu_share", "server_busiest_thread",
           "client_server_core_overlap_share", "core_watch_source"]
TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def physical_cores() -> dict[int, tuple[int, int]]:
    """Each CPU's physical core as (package, core): CPUs that share one are hyperthread siblings."""
    cores: dict[int, tuple[int, int]] = {}
    for topo in Path("/sys/devices/system/cpu").glob("cpu[0-9]*/topology"):
        cpu = int(topo.parent.name[3:])
        try:
            cores[cpu] = (int((topo / "physical_package_id").read_text()), int((topo / "core_id").read_text()))
        except (OSError, ValueError):
            cores[cpu] = (0, cpu)
    return cores


def thread_stats(pid: int) -> dict[int, tuple[float, int]]:
    """Each thread of ``pid``: its CPU seconds so far (user + system) and the CPU it last ran on.
    A process or thread that has ended is left out."""
    out: dict[int, tuple[float, int]] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat", "rb") as f:
                line = f.read().decode()
        except OSError:
            continue
        fields = line[line.rindex(")") + 2:].split()  # after "pid (comm) ": field 3 on
        out[int(tid)] = ((int(fields[11]) + int(fields[12])) * TICK_S, int(fields[36]))  # utime, stime; processor
    return out


def tree(pid: int) -> list[psutil.Process]:
    """``pid`` and its descendants (none where it has ended)."""
    try:
        p = psutil.Process(pid)
        return [p, *p.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _name(p: psutil.Process) -> str:
    try:
        return p.name()
    except psutil.Error:
        return "?"


def _comm(pid: int, tid: int) -> str:
    try:
        return Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
    except OSError:
        return "?"


@dataclass
class CoreWatch:
    """Samples the threads of a server's process tree and a client's (the client's tree less the server's: a server
    started by the client is the server's) every ``interval_s`` while open.

    ``summary()`` gives the window's CPU share of each server process (by pid, with its name), the client's total
    and ``core_overlap_share``; ``columns()`` a cell's columns."""

    server_pid: int
    client_pid: int = field(default_factory=os.getpid)
    interval_s: float = INTERVAL_S
    _cores: dict[int, tuple[int, int]] = field(default_factory=physical_cores)
    _last: dict[tuple[int, int], float] = field(default_factory=dict)  # (pid, tid) -> CPU seconds
    _cpu: dict[tuple[str, int], float] = field(default_factory=dict)  # (side, pid) -> CPU seconds in the window
    _threads: dict[tuple[int, int], float] = field(default_factory=dict)  # server (pid, tid) -> CPU seconds
    _names: dict[int, str] = field(default_factory=dict)
    _comms: dict[tuple[int, int], str] = field(default_factory=dict)
    _procs: list[tuple[str, psutil.Process]] = field(default_factory=list)
    _intervals: int = 0
    _overlaps: int = 0
    _wall: float = 0.0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def _sides(self) -> Iterable[tuple[str, psutil.Process]]:
        server = tree(self.server_pid)
        skip = {p.pid for p in server}
        for p in server:
            yield "server", p
        for p in tree(self.client_pid):
            if p.pid not in skip:
                yield "client", p

    def sample(self, first: bool = False) -> None:
        """One interval: each thread's CPU since the last sample, and whether busy threads of both sides shared a
        physical core."""
        busy: dict[str, set[tuple[int, int]]] = {"server": set(), "client": set()}
        if first or self._intervals % TREE_EVERY == 0:
            self._procs = list(self._sides())
        for side, proc in self._procs:
            self._names.setdefault(proc.pid, _name(proc))
            for tid, (cpu_s, cpu) in thread_stats(proc.pid).items():
                used = cpu_s - self._last.get((proc.pid, tid), cpu_s)
                self._last[(proc.pid, tid)] = cpu_s
                if first:
                    continue
                self._cpu[(side, proc.pid)] = self._cpu.get((side, proc.pid), 0.0) + used
                if side == "server":
                    self._threads[(proc.pid, tid)] = self._threads.get((proc.pid, tid), 0.0) + used
                    if (proc.pid, tid) not in self._comms:
                        self._comms[(proc.pid, tid)] = _comm(proc.pid, tid)
                if used >= BUSY_SHARE * self.interval_s:
                    busy[side].add(self._cores.get(cpu, (0, cpu)))
        if not first:
            self._intervals += 1
            self._overlaps += bool(busy["server"] & busy["client"])

    def _run(self) -> None:
        self.sample(first=True)
        t0 = time.perf_counter()
        while not self._stop.wait(self.interval_s):
            self.sample()
        self.sample()  # the last, partial interval: the CPU counted covers the whole wall time
        self._wall = time.perf_counter() - t0

    def __enter__(self) -> CoreWatch:
        self._thread = threading.Thread(target=self._run, daemon=True, name="core-watch")
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def summary(self) -> dict[str, Any]:
        """The window's CPU shares (CPU seconds over wall seconds) and the share of intervals that overlapped."""
        wall = self._wall or float("nan")
        server = {f"{self._names.get(pid, '?')}[{pid}]": used / wall
                  for (side, pid), used in sorted(self._cpu.items(), key=lambda kv: -kv[1]) if side == "server"}
        client = sum(used for (side, _), used in self._cpu.items() if side == "client") / wall
        return {"server_cpu_share_by_process": server, "client_cpu_share_total": client,
                "core_overlap_share": self._overlaps / self._intervals if self._intervals else None,
                "core_watch_intervals": self._intervals, "core_watch_s": self._wall}

    def columns(self) -> dict[str, Any]:
        """The cell's columns (``COLUMNS``): the server tree's CPU in cores, its busiest thread's share of one core
        and name (``process[pid]/thread``), and the overlap share."""
        wall = self._wall or float("nan")
        source = f"/proc threads of pid {self.server_pid}'s tree and pid {self.client_pid}'s, " \
                 f"{self._intervals} intervals of {self.interval_s:g} s"
        if not self._threads:
            return unwatched(f"no server thread seen ({source})")
        (pid, tid), used = max(self._threads.items(), key=lambda kv: kv[1])
        return {"server_cpu_cores": sum(u for (side, _), u in self._cpu.items() if side == "server") / wall,
                "server_busiest_thread_cpu_share": used / wall,
                "server_busiest_thread": f"{self._names.get(pid, '?')}[{pid}]/{self._comms.get((pid, tid), '?')}",
                "client_server_core_overlap_share": self._overlaps / self._intervals if self._intervals else None,
                "core_watch_source": source}


def unwatched(reason: str) -> dict[str, Any]:
    """The columns of a cell whose server's threads could not be watched, with the reason."""
    return {**dict.fromkeys(COLUMNS[:4]), "core_watch_source": f"none: {reason}"}
