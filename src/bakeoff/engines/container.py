"""A server's container, named after its job and never left behind.

Why: ``docker run`` starts the server in the Docker daemon, not under the
client. Stopping the client (or killing its process group) leaves the
container running and holding the GPUs. So every container bakeoff starts:

* is named after its job (:func:`container_name`), so a stale one from a
  crashed run is found and removed before the next start;
* is stopped and removed by name (``docker stop`` then ``docker rm -f``) on
  every exit path that runs Python code (normal end, start failure, Ctrl-C,
  SIGTERM from the launcher watch), and by a detached *reaper* process when
  the stage itself dies without running any (SIGKILL): the reaper waits for
  the stage's pid to disappear, then removes the container;
* has its image pulled as a separate step before the start, with the pull's
  progress in the log, so a slow download never eats the startup timeout;
* has its memory read from the container (its cgroup, else ``docker stats``),
  not from the ``docker run`` client, whose RSS is a few megabytes.

The runtime is the ``docker`` executable found on PATH (``podman`` accepts
the same commands); tests put a stand-in that records its calls first.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from bakeoff.errors import BakeoffError

RUNTIME = "docker"
STOP_GRACE_S = 15
_UNITS = {"b": 1, "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4,
          "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4}


class ImagePullError(BakeoffError):
    """The container image is not present and could not be pulled."""


def container_name(job: str, where: Path) -> str:
    """``bakeoff-<job>-<6 hex>``: readable, and distinct for two checkouts running the same job.

    Docker names allow ``[a-zA-Z0-9][a-zA-Z0-9_.-]*``; other characters become ``-``.
    """
    slug = re.sub(r"[^a-zA-Z0-9_.-]+", "-", job).strip("-.") or "job"
    digest = hashlib.sha256(str(Path(where).resolve()).encode()).hexdigest()[:6]
    return f"bakeoff-{slug}-{digest}"


def parse_mem_usage(text: str) -> int | None:
    """Bytes used from ``docker stats``' MemUsage column (``"1.5GiB / 31.2GiB"``)."""
    m = re.match(r"\s*([0-9.]+)\s*([a-zA-Z]+)", text.split("/")[0])
    if not m or m.group(2).lower() not in _UNITS:
        return None
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def cgroup_memory_files(container_id: str, root: Path = Path("/sys/fs/cgroup")) -> list[Path]:
    """Where the kernel reports a Docker container's memory (cgroup v2 systemd and cgroupfs layouts, then v1)."""
    return [root / "system.slice" / f"docker-{container_id}.scope" / "memory.current",
            root / "docker" / container_id / "memory.current",
            root / "memory" / "docker" / container_id / "memory.usage_in_bytes",
            root / "memory" / "system.slice" / f"docker-{container_id}.scope" / "memory.usage_in_bytes"]


class Container:
    """One named container of one job: run arguments, image pull, memory, stop and removal."""

    def __init__(self, name: str, image: str, log_path: Path, runtime: str = RUNTIME) -> None:
        self.name = name
        self.image = image
        self.log_path = Path(log_path)
        self.runtime = runtime
        self._id: str | None = None
        self._reaper: subprocess.Popen | None = None

    def _exe(self) -> str:
        exe = shutil.which(self.runtime)
        if exe is None:
            raise BakeoffError(f"hardware.vllm_image={self.image!r} needs the {self.runtime!r} executable on PATH; "
                               "set hardware.vllm_image=null to run vLLM from envs/vllm-node.yaml instead")
        return exe

    def _call(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run([self._exe(), *args], capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)

    def run_prefix(self) -> list[str]:
        """``docker run`` up to the image-specific arguments: named, labelled, removed when it ends."""
        return [self.runtime, "run", "--rm", "--name", self.name, "--label", "bakeoff.job=" + self.name]

    def pull(self, progress: bool = True) -> bool:
        """Pull the image unless present (True: pulled). Progress lines go to the log and stderr; no timeout."""
        if self._call("image", "inspect", "--format", "{{.Id}}", self.image).returncode == 0:
            return False
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        with open(self.log_path, "a") as log:
            log.write(f"$ {self.runtime} pull {self.image}\n")
            log.flush()
            proc = subprocess.Popen([self._exe(), "pull", self.image], stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True)
            assert proc.stdout is not None
            lines = []
            for line in proc.stdout:
                log.write(line)
                log.flush()
                lines.append(line.strip())
                if progress:
                    print(f"[pull {self.image}] {line.rstrip()}", file=sys.stderr, flush=True)
            rc = proc.wait()
            log.write(f"# pull finished in {time.monotonic() - t0:.1f}s (exit {rc})\n")
        if rc != 0:
            raise ImagePullError(f"{self.runtime} pull {self.image} failed (exit {rc}): "
                                 f"{next((ln for ln in reversed(lines) if ln), 'no output')}")
        return True

    def remove_stale(self) -> None:
        """A container of this name left by a killed run: remove it, so the name (and its GPUs) are free."""
        self._call("rm", "--force", self.name)

    def container_id(self) -> str | None:
        if self._id is None:
            p = self._call("inspect", "--format", "{{.Id}}", self.name, timeout=30)
            self._id = p.stdout.strip() or None if p.returncode == 0 else None
        return self._id

    def memory_bytes(self) -> int | None:
        """Memory charged to the container now: its cgroup's counter, else ``docker stats``."""
        cid = self.container_id()
        for f in cgroup_memory_files(cid) if cid else []:
            try:
                return int(f.read_text().strip())
            except (OSError, ValueError):
                continue
        p = self._call("stats", "--no-stream", "--format", "{{.MemUsage}}", self.name, timeout=30)
        return parse_mem_usage(p.stdout) if p.returncode == 0 else None

    def memory_source(self) -> str:
        cid = self.container_id()
        if cid and any(f.exists() for f in cgroup_memory_files(cid)):
            return "container cgroup"
        return f"{self.runtime} stats"

    def start_reaper(self, owner_pid: int | None = None) -> None:
        """A detached process that removes the container once ``owner_pid`` (default: this process) is gone."""
        self._reaper = subprocess.Popen(
            [sys.executable, "-m", "bakeoff.engines.container", str(owner_pid or os.getpid()), self._exe(), self.name],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

    def stop(self) -> None:
        """``docker stop`` (SIGTERM, then SIGKILL after the grace period), then ``docker rm -f``; then the reaper ends."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._call("stop", "--time", str(STOP_GRACE_S), self.name, timeout=STOP_GRACE_S + 60)
        self._call("rm", "--force", self.name)
        if self._reaper is not None and self._reaper.poll() is None:
            self._reaper.terminate()
            self._reaper.wait(timeout=10)


def reap(owner_pid: int, exe: str, name: str, interval_s: float = 0.5) -> None:
    """Wait for ``owner_pid`` to end, then remove the container (the reaper process's body)."""
    while True:
        try:
            os.kill(owner_pid, 0)
        except ProcessLookupError:
            break
        except PermissionError:
            pass
        if Path(f"/proc/{owner_pid}/stat").exists():
            try:
                if Path(f"/proc/{owner_pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                    break
            except (OSError, IndexError):
                break
        time.sleep(interval_s)
    subprocess.run([exe, "rm", "--force", name], capture_output=True, stdin=subprocess.DEVNULL, timeout=120)


if __name__ == "__main__":  # python -m bakeoff.engines.container OWNER_PID RUNTIME_EXE NAME
    reap(int(sys.argv[1]), sys.argv[2], sys.argv[3])
