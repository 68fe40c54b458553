"""Open an MLflow experiment in headless Chromium and check what a person would see.

Why a browser: whether MLflow 3's UI opens on the runs table (not the GenAI overview) and shows each cell
run's real duration is decided by the UI's own JavaScript, so only a rendered page shows it.

    python scripts/mlflow_ui_check.py --store mlflow.db --experiment bakeoff --run smoke [--screenshot ui.png]

It opens the address bakeoff records (``ui_path`` in results/mlflow/runs.json) and, with ``--bare``, the
experiment's plain address too, which MLflow 3.17 opens on its GenAI overview whatever the experiment's
tags say. Needs Debian's Chromium (`apt-get install chromium`; /usr/bin/chromium). Exits non-zero, naming
what is missing, when the page does not show the runs table with the run.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def render(url: str, screenshot: Path | None = None, budget_ms: int = 20000) -> str:
    """The page's DOM after its scripts ran (Chromium's --dump-dom), and optionally a screenshot."""
    with tempfile.TemporaryDirectory() as profile:
        base = [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", f"--virtual-time-budget={budget_ms}",
                "--window-size=1600,1000"]
        dom = subprocess.run([*base, "--dump-dom", url], capture_output=True, text=True, timeout=120).stdout
        if screenshot is not None:
            subprocess.run([*base, f"--screenshot={screenshot}", url], capture_output=True, timeout=120)
    return dom


def _stop(server: subprocess.Popen) -> None:
    """The server and its workers (its own process group): SIGTERM, then SIGKILL after 30 s."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(server.pid, sig)
            server.wait(timeout=30)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue


def check(store: Path, experiment: str, run: str, bare: bool = False, screenshot: Path | None = None) -> list[str]:
    """Problems seen on the experiment's page (empty: it opens on the runs table showing ``run``)."""
    from mlflow.tracking import MlflowClient

    from bakeoff.results.tracking import ui_path

    uri = f"sqlite:///{store.resolve()}"
    exp = MlflowClient(tracking_uri=uri).get_experiment_by_name(experiment)
    if exp is None:
        return [f"no experiment {experiment!r} in {store}"]
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--backend-store-uri", uri,
                               "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        for _ in range(300):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except OSError:
                time.sleep(1)
        else:
            return ["the MLflow server did not answer on /health within 300 s"]
        path = f"/#/experiments/{exp.experiment_id}" if bare else ui_path(exp.experiment_id)
        dom = render(f"http://127.0.0.1:{port}{path}", screenshot)
    finally:
        _stop(server)
    problems = []
    if run not in dom:
        problems.append(f"run {run!r} is not on the experiment's first page")
    if "Run Name" not in dom:
        problems.append("no runs table ('Run Name' column) on the experiment's first page")
    return problems


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--store", type=Path, required=True, help="the MLflow sqlite file")
    p.add_argument("--experiment", required=True)
    p.add_argument("--run", required=True, help="(the start of) a run name the runs table must show")
    p.add_argument("--bare", action="store_true", help="open the experiment's plain address instead")
    p.add_argument("--screenshot", type=Path)
    a = p.parse_args()
    problems = check(a.store, a.experiment, a.run, a.bare, a.screenshot)
    for line in problems:
        print(f"mlflow UI: {line}", file=sys.stderr)
    if not problems:
        print(f"mlflow UI: experiment {a.experiment!r} opens on its runs table and shows {a.run!r}")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
