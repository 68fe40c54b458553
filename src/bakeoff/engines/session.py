"""One variant's server for the length of a stage, and the stop that always reaches it.

Why here: a stage starts, restarts and stops servers, but the rules for doing
so (an engine's refusal before start, the image pull outside the startup
timeout, what a failed start means) are the engine's. The signal handling sits
beside it because its one job is to unwind into ``Session.stop``: SIGTERM,
Ctrl-C, SIGHUP and the launcher's death all become :class:`Interrupted`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

from bakeoff.engines import ServerSpec, get_engine
from bakeoff.engines.base import Engine
from bakeoff.engines.container import ImagePullError
from bakeoff.proc import ServerStartError


class Interrupted(BaseException):
    """The stage was signalled (Ctrl-C, SIGTERM, its launcher died); the server has been stopped.

    A BaseException, as KeyboardInterrupt is: raised from a signal handler it can land inside any code,
    and an ``except Exception`` there (a quality task's, a client library's) must not swallow the stop.
    """


def _on_signal(signum: int, _frame: Any) -> None:
    raise Interrupted(f"interrupted by signal {signum}; the server was stopped and finished cells were kept")


def _alive(pid: int) -> bool:
    """Running and not a zombie (a killed launcher stays a zombie until its own parent reaps it)."""
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def watch_launcher(pid: int | None, interval_s: float = 0.5) -> None:
    """SIGTERM ourselves once ``pid`` (the launching snakemake; default: our parent) is gone.

    The server lives in its own process group, so it never sees the signals
    that end its launcher; this turns the launcher's death -- even SIGKILL --
    into our orderly stop. A launcher already gone when we start counts too.
    """
    target = pid or os.getppid()
    me = os.getpid()

    def loop() -> None:
        while True:
            if not _alive(target) or (pid is None and os.getppid() != target):
                os.kill(me, signal.SIGTERM)
                return
            time.sleep(interval_s)

    threading.Thread(target=loop, daemon=True, name="launcher-watch").start()


@contextlib.contextmanager
def stop_on_signals(launcher_pid: int | None) -> Iterator[None]:
    """Turn SIGTERM, SIGINT, SIGHUP and the launcher's death into :class:`Interrupted` inside the block.

    The exception unwinds through the callers' ``finally`` blocks, which stop the server (and its container).
    """
    old = {s: signal.signal(s, _on_signal) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    if launcher_pid is not None:
        watch_launcher(launcher_pid)
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def start_id(t: float, pid: int) -> str:
    """A server start's id: its UTC start time (to the microsecond) and the server's pid.

    Why both: ``Session.starts`` counts starts within one process, so a job resumed in a new process counts
    from 1 again; the time and pid together tell two starts apart across processes, node calls and nodes.
    """
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(t))
    return f"{stamp}.{int(t * 1e6) % 1_000_000:06d}Z-{pid}"


class Session:
    """The server for one variant, restartable after it dies."""

    def __init__(self, spec: ServerSpec, plugin: str) -> None:
        self.spec = spec
        self.plugin = plugin
        self.engine: Engine | None = None
        self.startup_s: float | None = None
        self.starts = 0  # server starts so far; each cell records the one it ran on (``server_start``)
        # What the running server set up (Engine.started_facts), and its start's id (``server_start_id``,
        # :func:`start_id`): every cell on that start records them, so a block's cells show which starts made them.
        self.facts: dict[str, Any] = {}
        self.notes: list[str] = []

    def start(self) -> tuple[str, str]:
        """Start and wait; returns ("ok", "") or (status, reason)."""
        self.engine = get_engine(self.plugin)(self.spec)
        self.starts += 1
        refusal = self.engine.refusal_before_start()
        if refusal is not None:
            return type(self.engine).start_failure_status(refusal), refusal
        try:
            self.engine.prepare()  # the image pull: its own step, outside the startup timeout
        except ImagePullError as e:
            return "failed", str(e)
        t_start = time.time()
        self.facts = {}
        try:
            self.engine.start()
        except OSError as e:  # the server's program could not be run at all (missing, not executable)
            return "failed", f"could not start the server: {type(e).__name__}: {e}"
        try:
            self.startup_s = self.engine.ready()
            facts, self.notes = self.engine.started_facts()
            self.facts = {**facts, "server_start_id": start_id(t_start, self.engine.pid() or os.getpid())}
            return "ok", ""
        except ServerStartError as e:
            reason = self.engine.failure_reason()
            self.engine.stop()
            if e.returncode is not None:
                return type(self.engine).start_failure_status(reason), reason
            return "failed", f"not ready within {self.spec.engine.startup_timeout_s:.0f}s: {reason}"

    def stop(self) -> None:
        if self.engine is not None:
            self.engine.stop()
