"""node.sh --prepare: CPU-only work starts in the background and outlives its call; the run waits for it.

Slow (two real Snakemake runs): a stand-in bundle whose Snakefile has a ``build_llamacpp`` rule (one of
what --prepare runs) and a ``serve_load`` rule that needs its output, as the real DAG has.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
from test_node_vllm_parts import wheel

from bakeoff.node import parts as node_parts
from bakeoff.node.bundle import NODE_SH, PREPARE_RULES

SNAKEFILE = """
rule node:
    input: "built.txt", "served.txt"

rule build_llamacpp:
    output: "built.txt"
    log: "logs/build.log"
    shell: "sleep 6; python3 -c 'import time; print(time.time())' > {output}"

rule serve_load:
    input: "built.txt"
    output: "served.txt"
    log: "logs/serve.log"
    shell: "python3 -c 'import time; print(time.time())' > {output}"
"""


@pytest.mark.slow
def test_prepare_returns_at_once_and_the_run_waits_for_it(tmp_path: Path):
    bundle = tmp_path / "bundle"
    (bundle / "whl").mkdir(parents=True)
    wheel(bundle / "whl", "tiny-dep", "1.0")
    stubs = "".join(f'\nrule {r}:\n    output: "{r}.stub"\n    log: "logs/{r}.log"\n    shell: "touch {{output}}"\n'
                    for r in PREPARE_RULES if r != "build_llamacpp")  # --until names every one of them
    data = (SNAKEFILE + stubs).encode()
    with tarfile.open(bundle / "repo.tgz", "w:gz") as tar:
        ti = tarfile.TarInfo("Snakefile")
        ti.size = len(data)
        tar.addfile(ti, io.BytesIO(data))
    (bundle / "node.sh").write_text(NODE_SH)
    (bundle / "node_parts.py").write_text(Path(node_parts.__file__).read_text())
    work, out = tmp_path / "node", tmp_path / "out"
    env = {**os.environ, "BAKEOFF_NODE_DIR": str(work), "BAKEOFF_NODE_SITE": str(tmp_path / "site"), "OUT": str(out),
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    t0 = time.monotonic()
    prep = subprocess.run(["bash", str(bundle / "node.sh"), "--prepare", "experiment=stand_in"], env=env, capture_output=True,
                          text=True, timeout=60)
    assert prep.returncode == 0 and "preparing in the background" in prep.stdout, prep.stdout + prep.stderr
    assert time.monotonic() - t0 < 4 and not (work / "built.txt").exists()  # returned before the build finished
    again = subprocess.run(["bash", str(bundle / "node.sh"), "--prepare", "experiment=stand_in"], env=env,
                           capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and "already preparing" in again.stdout  # one prepare at a time
    short = subprocess.run(["bash", str(bundle / "node.sh"), "experiment=stand_in"], capture_output=True, text=True,
                           env={**env, "BAKEOFF_NODE_TIMEOUT_S": "60"}, timeout=60)
    assert short.returncode == 5 and "call again" in short.stdout  # a call too short to wait leaves it running
    run = subprocess.run(["bash", str(bundle / "node.sh"), "experiment=stand_in"], env=env, capture_output=True,
                         text=True, timeout=300)
    assert "waiting for the background prepare" in run.stdout, run.stdout + run.stderr
    log = (out / "snakemake.log").read_text()
    assert "snakemake rc=0" in log and "rule serve_load" in log and "rule build_llamacpp" not in log
    assert float((work / "served.txt").read_text()) > float((work / "built.txt").read_text())
    assert "rule build_llamacpp" in (work / "prepare.log").read_text()
