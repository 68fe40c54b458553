"""The test cluster itself (tests/slurmcluster.py): it comes up idle, and leaves no daemon or job behind.

Why: the cluster tier's other tests trust that a failed run cannot leave a scheduler or a server running
on the machine; this checks the teardown with a job still running.
"""

from __future__ import annotations

import time
from pathlib import Path

import psutil
import pytest

from slurmcluster import slurm_cluster

pytestmark = [pytest.mark.slow, pytest.mark.cluster]  # slow too: `pytest -m "not slow"` never starts a cluster


def _alive(pid: int) -> bool:
    return psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE


def test_the_cluster_stops_its_daemons_and_a_running_job(tmp_path: Path) -> None:
    marker = f"bakeoff-teardown-probe-{tmp_path.name}"
    with slurm_cluster(tmp_path / "slurm") as cluster:
        assert cluster.node_state() == "idle"
        daemons = [p.pid for p in cluster.procs.values()]
        jobid = cluster.run("sbatch", "--parsable", "--output=/dev/null", "--wrap",
                            f"exec bash -c 'exec -a {marker} sleep 600'").stdout.strip()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not any(i == jobid and s == "RUNNING" for i, s, _ in cluster.queue()):
            time.sleep(0.5)
        assert [p.pid for p in psutil.process_iter(["cmdline"]) if marker in " ".join(p.info["cmdline"] or [])], (
            f"job {jobid} is not running: {cluster.queue()}")
    assert not [p for p in daemons if _alive(p)]
    assert not [p.pid for p in psutil.process_iter(["cmdline"]) if marker in " ".join(p.info["cmdline"] or [])]
