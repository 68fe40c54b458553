"""Server processes that never outlive their owner.

Why: a benchmark harness that leaks an inference server poisons every later
measurement on the machine (and holds GPU memory). Each server runs in its own
process group; stopping sends SIGTERM to the whole group, then SIGKILL after a
grace period. Readiness is an HTTP health poll with a timeout, and a failure
carries the tail of the server's log so the user sees the engine's own error.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from bakeoff.errors import BakeoffError


class ServerStartError(BakeoffError):
    """The server exited or did not become healthy; ``log_tail`` says why."""

    def __init__(self, message: str, log_tail: str = "", returncode: int | None = None) -> None:
        super().__init__(f"{message}\n--- server log tail ---\n{log_tail}" if log_tail else message)
        self.log_tail = log_tail
        self.returncode = returncode


def free_port(host: str = "127.0.0.1") -> int:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def tail(path: Path, lines: int = 40) -> str:
    try:
        return "".join(path.read_text(errors="replace").splitlines(keepends=True)[-lines:])
    except FileNotFoundError:
        return ""


class ManagedProcess:
    """A subprocess in its own process group, with its output in ``log_path``."""

    def __init__(self, cmd: Sequence[str], log_path: Path, env: dict[str, str] | None = None,
                 cwd: Path | None = None) -> None:
        self.cmd = list(cmd)
        self.log_path = Path(log_path)
        self.env = env
        self.cwd = cwd
        self.proc: subprocess.Popen | None = None

    def start(self) -> ManagedProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            log.write(("$ " + " ".join(self.cmd) + "\n").encode())
            log.flush()
            self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=self.env, cwd=self.cwd, start_new_session=True,
                                         preexec_fn=_die_with_parent)
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def exit_description(self) -> str | None:
        """How the process ended (``killed by SIGKILL (signal 9)``, ``exited with code 1``); None while it runs."""
        if self.proc is None or self.proc.poll() is None:
            return None
        rc = self.proc.returncode
        if rc < 0:
            try:
                name = signal.Signals(-rc).name
            except ValueError:
                name = "an unknown signal"
            return f"killed by {name} (signal {-rc})"
        return f"exited with code {rc}"

    def log_since_start(self, lines: int = 400) -> str:
        """The last ``lines`` of what this start wrote (the log is appended to across restarts)."""
        text = tail(self.log_path, lines)
        marker = "$ " + " ".join(self.cmd) + "\n"
        return text.rsplit(marker, 1)[1] if marker in text else text

    def wait_healthy(self, url: str, timeout_s: float, interval_s: float = 0.5) -> float:
        """Poll ``url`` until it answers 200; return seconds taken."""
        t0 = time.monotonic()
        while True:
            if not self.alive():
                rc = self.proc.returncode if self.proc else None
                raise ServerStartError(f"server exited with code {rc} before becoming ready: {' '.join(self.cmd[:4])} ...",
                                       tail(self.log_path), rc)
            try:
                with urllib.request.urlopen(url, timeout=5) as r:
                    if r.status == 200:
                        return time.monotonic() - t0
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            if time.monotonic() - t0 > timeout_s:
                self.stop()
                raise ServerStartError(f"server not ready after {timeout_s:.0f}s at {url}", tail(self.log_path))
            time.sleep(interval_s)

    def wait_exit(self, timeout_s: float) -> int:
        """Wait for the process to end by itself (killing the group on timeout)."""
        assert self.proc is not None
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.stop()
            raise

    def stop(self, grace_s: float = 15.0) -> None:
        """SIGTERM the whole group, then SIGKILL whatever is left."""
        if self.proc is None:
            return
        pgid = self.proc.pid  # start_new_session: the group id is the leader's pid
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline and _group_alive(pgid):
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(timeout=0.2)
            if not _group_alive(pgid):
                break
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)

    def __enter__(self) -> ManagedProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _die_with_parent() -> None:
    """In the child: get SIGTERM if the parent dies (even by SIGKILL), so no server is orphaned."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # killpg(0) succeeds while any member exists, zombies included; reap check via /proc
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False
