"""A real single-node Slurm for the `cluster` test tier: Debian's slurm-wlm and munge as child processes.

Why: the SLURM profile had only been planned (dry runs). This starts munged, slurmctld and slurmd in a
temporary directory with a generated slurm.conf (one node, this machine; a GPU gres only where nvidia-smi
lists GPUs), so the workflow's jobs go through a real scheduler. The host's /etc is never written: clients
here find the cluster through ``SLURM_CONF``, and slurmd runs in a private mount namespace whose
/etc/slurm is the temporary directory, so a job's own ``srun`` finds the config where a real node keeps it
(the SLURM executor's job step drops ``SLURM_CONF`` from srun's environment). Teardown cancels every job,
stops the daemons and fails loudly if any Slurm process outlives them.

Finished jobs are recorded by ``jobcomp/filetxt`` (one ``Key=Value`` line a job): no slurmdbd or database
is needed, and the record stays after ``MinJobAge``; see :meth:`SlurmCluster.records`.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

import psutil

DAEMONS = {"munged": "munge", "slurmctld": "slurmctld", "slurmd": "slurmd"}  # binary -> Debian package
CLIENTS = {"sinfo": "slurm-client", "sbatch": "slurm-client", "squeue": "slurm-client", "scancel": "slurm-client",
           "scontrol": "slurm-client", "srun": "slurm-client", "mungekey": "munge", "unshare": "util-linux"}
PARTITION = "bakeoff"
# jobcomp/filetxt writes one line a job: Key=Value pairs separated by spaces (values have none but Name's,
# which a following " Key=" ends).
_PAIR = re.compile(r"(\w+)=(.*?)(?= \w+=|$)")


def missing_tools() -> dict[str, str]:
    """Slurm/munge programs not found (name -> the Debian package that has it); empty when all are there."""
    found = {**DAEMONS, **CLIENTS}
    return {name: pkg for name, pkg in found.items()
            if not (shutil.which(name) or Path("/usr/sbin", name).exists())}


def _exe(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def machine_gpus() -> int:
    """GPUs nvidia-smi lists here (0 without a driver): the node's gres."""
    if not shutil.which("nvidia-smi"):
        return 0
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def parse_record(line: str) -> dict[str, str]:
    """One jobcomp/filetxt line as a dict."""
    return {k: v for k, v in _PAIR.findall(line.strip())}


def tres(record: dict[str, str]) -> dict[str, str]:
    """A record's allocated trackable resources, e.g. {'cpu': '8', 'mem': '16000M', 'node': '1'}."""
    return dict(item.split("=", 1) for item in record.get("Tres", "").split(",") if "=" in item)


def mem_mb(value: str) -> int:
    """Slurm's memory notation (16000M, 125G, 1T) in MB."""
    m = re.fullmatch(r"([\d.]+)([KMGT]?)", value)
    if not m:
        raise ValueError(f"not a Slurm memory amount: {value!r}")
    scale = {"K": 1 / 1024, "": 1, "M": 1, "G": 1024, "T": 1024 * 1024}[m.group(2)]
    return round(float(m.group(1)) * scale)


@dataclass
class SlurmCluster:
    """A running controller and node; ``env`` is what a client (sbatch, Snakemake) needs to reach them."""

    root: Path
    node: str
    cpus: int
    mem_mb: int
    gpus: int
    partition: str = PARTITION
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    node_ns: str = ""  # slurmd's mount namespace: its jobs' processes share it

    @property
    def conf(self) -> Path:
        return self.root / "etc" / "slurm.conf"

    @property
    def jobcomp(self) -> Path:
        return self.root / "jobcomp.txt"

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def run(self, *cmd: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
        """A Slurm client command against this cluster."""
        proc = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip()}\n{self.logs()}")
        return proc

    def records(self) -> list[dict[str, str]]:
        """Every finished job's jobcomp/filetxt record, in the order they ended."""
        if not self.jobcomp.exists():
            return []
        return [parse_record(line) for line in self.jobcomp.read_text().splitlines() if line.strip()]

    def job(self, jobid: str) -> dict[str, str]:
        """``scontrol show job`` as a dict (kept MinJobAge after the end): StdOut, Command, Comment, ..."""
        out = self.run("scontrol", "show", "job", "--oneliner", jobid).stdout
        return parse_record(out.replace("\n", " "))

    def queue(self) -> list[tuple[str, str, str]]:
        """Jobs the controller knows now: (job id, state, comment)."""
        out = self.run("squeue", "--states=all", "--noheader", "--format=%i|%T|%k").stdout
        return [tuple(line.split("|", 2)) for line in out.splitlines() if line.strip()]  # type: ignore[misc]

    def node_state(self) -> str:
        return self.run("sinfo", "--noheader", "--Node", "--format=%t", check=False).stdout.strip()

    def logs(self, chars: int = 1500) -> str:
        """The daemons' log tails, for error messages."""
        parts = []
        for name in DAEMONS:
            path = self.root / f"{name}.log"
            if path.exists():
                parts.append(f"--- {path} ---\n{path.read_text(errors='replace')[-chars:]}")
        return "\n".join(parts)


def _conf(root: Path, node: str, cpus: int, mem: int, gpus: int, ports: tuple[int, int], sock: Path) -> str:
    gres = f" Gres=gpu:{gpus}" if gpus else ""
    return f"""\
# Generated by tests/slurmcluster.py: one node ({node}), one partition, no accounting database.
ClusterName=bakeoff-test
SlurmctldHost={node}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={sock}
SlurmctldPort={ports[0]}
SlurmdPort={ports[1]}
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SchedulerType=sched/backfill
MpiDefault=none
SwitchType=switch/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/filetxt
JobCompLoc={root}/jobcomp.txt
# Finished jobs stay in squeue an hour: the executor plugin's squeue status needs them (>= 120 s).
MinJobAge=3600
ReturnToService=2
# The node is declared as given, even where that is more than slurmd detects (see slurm_cluster()).
SlurmdParameters=config_overrides
{"GresTypes=gpu" if gpus else ""}
NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} Boards=1 SocketsPerBoard=1 CoresPerSocket={cpus} ThreadsPerCore=1 \
RealMemory={mem}{gres} State=UNKNOWN
PartitionName={PARTITION} Nodes={node} Default=YES MaxTime=INFINITE State=UP
"""


def _stop(proc: subprocess.Popen, grace: float = 10) -> None:
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)


def _mount_ns(pid: int) -> str:
    return os.readlink(f"/proc/{pid}/ns/mnt")


def _node_processes(cluster: SlurmCluster) -> set[int]:
    """The node's processes but slurmd: job step daemons (slurmstepd detaches from slurmd) and the jobs'
    processes, told from everything else on the machine by slurmd's private mount namespace."""
    slurmd = cluster.procs.get("slurmd")
    if slurmd is None or not cluster.node_ns:
        return set()
    pids = set()
    for p in psutil.process_iter():
        with suppress(psutil.Error, OSError):
            if p.pid != slurmd.pid and p.status() != psutil.STATUS_ZOMBIE and _mount_ns(p.pid) == cluster.node_ns:
                pids.add(p.pid)
    return pids


@contextmanager
def slurm_cluster(root: Path, min_cpus: int = 1, min_mem_mb: int = 1, timeout: float = 60) -> Iterator[SlurmCluster]:
    """Start munged, slurmctld and slurmd under ``root``; yield once ``sinfo`` shows the node idle; stop all.

    The node has this machine's cores and memory, raised to ``min_cpus``/``min_mem_mb`` where the machine
    is smaller, so a profile written for bigger nodes is submitted unchanged (Slurm then schedules against
    the declared size; with task/none nothing binds or limits a job to it).
    """
    if missing := missing_tools():
        raise RuntimeError(f"Slurm/munge programs missing: {sorted(missing)}; install: "
                           f"apt-get install -y {' '.join(sorted(set(missing.values())))}")
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o700)  # munged refuses a key or socket in a directory others can write
    for sub in ("state", "spool", "munge", "etc"):
        (root / sub).mkdir(exist_ok=True)
    (root / "munge").chmod(0o700)
    node = socket.gethostname().split(".")[0]
    cpus = max(os.cpu_count() or 1, min_cpus)
    mem = max(psutil.virtual_memory().total // 2**20 - 1024, min_mem_mb)
    cluster = SlurmCluster(root=root, node=node, cpus=cpus, mem_mb=mem, gpus=machine_gpus())
    sock = root / "munge" / "munge.socket"
    key = root / "munge" / "munge.key"
    cluster.conf.write_text(_conf(root, node, cpus, mem, cluster.gpus, (_free_port(), _free_port()), sock))
    try:
        subprocess.run([_exe("mungekey"), "--create", f"--keyfile={key}"], check=True, capture_output=True)
        key.chmod(0o400)
        commands = {
            "munged": [_exe("munged"), "--foreground", "--force", f"--socket={sock}", f"--key-file={key}",
                       f"--pid-file={root}/munge/munged.pid", f"--seed-file={root}/munge/munged.seed",
                       f"--log-file={root}/munged.log"],
            "slurmctld": [_exe("slurmctld"), "-D", "-i", "-f", str(cluster.conf)],
            # /etc/slurm of slurmd and its jobs (not of this host): the generated config.
            "slurmd": ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                       'mount --bind "$1" /etc/slurm && exec "$2" -D -f "$3" -N "$4"', "slurmd",
                       str(cluster.conf.parent), _exe("slurmd"), str(cluster.conf), node],
        }
        for name, cmd in commands.items():
            with open(root / f"{name}.out", "w") as out:
                cluster.procs[name] = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=cluster.env,
                                                       start_new_session=True)
            if name == "munged":
                _wait(lambda: sock.exists(), timeout, "munged's socket", cluster)
        _wait(lambda: cluster.node_state() == "idle", timeout, f"sinfo to show node {node} idle", cluster)
        cluster.node_ns = _mount_ns(cluster.procs["slurmd"].pid)
        if cluster.node_ns == _mount_ns(os.getpid()):
            raise RuntimeError("slurmd did not get a mount namespace of its own (unshare --mount)")
        yield cluster
    finally:
        _teardown(cluster)


def _wait(ready, timeout: float, what: str, cluster: SlurmCluster) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        dead = {n: p.returncode for n, p in cluster.procs.items() if p.poll() is not None}
        if dead or time.monotonic() > deadline:
            raise RuntimeError(f"Slurm test cluster: gave up waiting for {what} after {timeout:.0f} s"
                               f"{f'; exited: {dead}' if dead else ''}\n{cluster.logs()}")
        time.sleep(0.5)


def _teardown(cluster: SlurmCluster) -> None:
    """Cancel every job, stop the daemons (slurmd first), and refuse to leave a job's processes behind."""
    if all(p.poll() is None for p in cluster.procs.values()) and len(cluster.procs) == len(DAEMONS):
        with suppress(RuntimeError, subprocess.TimeoutExpired):  # a dead controller: stop what is left anyway
            cluster.run("scancel", f"--partition={cluster.partition}", check=False)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and any(s in ("RUNNING", "COMPLETING", "PENDING", "CONFIGURING")
                                                      for _, s, _ in cluster.queue()):
                time.sleep(0.5)
    deadline = time.monotonic() + 30
    while (left := _node_processes(cluster)) and time.monotonic() < deadline:
        time.sleep(0.5)
    left = _node_processes(cluster)
    for name in reversed(list(cluster.procs)):
        _stop(cluster.procs[name])
    for pid in left:
        with suppress(psutil.NoSuchProcess):
            psutil.Process(pid).kill()
    if left:
        raise RuntimeError(f"job processes outlived the test cluster's jobs (killed): {sorted(left)}")
