"""node.sh --prepare: CPU-only work starts in the background and outlives its call; the run waits for it.

Slow (two real Snakemake runs): a stand-in bundle whose Snakefile has a ``build_llamacpp`` rule (one of
what --prepare runs) and a ``serve_load`` rule that needs its output, as the real DAG has.
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
from test_node_vllm_parts import wheel

from bakeoff.node import parts as node_parts
from bakeoff.node.bundle import NODE_SH, PREPARE_RULES, PREPARE_TARGET

from conftest import ROOT

SNAKEFILE = """
rule node:
    input: "built.txt", "served.txt"

rule node_prepare:
    input: "built.txt"

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


def stand_in_bundle(tmp_path: Path, snakefile: str, src: Path | None = None) -> tuple[Path, dict[str, str]]:
    """A bundle as ``bakeoff node pack`` lays one out (a wheel, repo.tgz with ``snakefile`` and, where given, the
    ``src`` tree, node.sh, node_parts.py) under ``tmp_path / "bundle"``, and the environment of a stand-in node
    under ``tmp_path`` (its run folder ``node``, its site, ``OUT`` at ``out``)."""
    bundle = tmp_path / "bundle"
    (bundle / "whl").mkdir(parents=True)
    wheel(bundle / "whl", "tiny-dep", "1.0")
    data = snakefile.encode()
    with tarfile.open(bundle / "repo.tgz", "w:gz") as tar:
        if src is not None:
            tar.add(src, arcname="src", filter=lambda ti: None if "__pycache__" in ti.name else ti)
        ti = tarfile.TarInfo("Snakefile")
        ti.size = len(data)
        tar.addfile(ti, io.BytesIO(data))
    (bundle / "node.sh").write_text(NODE_SH)
    (bundle / "node_parts.py").write_text(Path(node_parts.__file__).read_text())
    env = {**os.environ, "BAKEOFF_NODE_DIR": str(tmp_path / "node"), "BAKEOFF_NODE_SITE": str(tmp_path / "site"),
           "OUT": str(tmp_path / "out"), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    return bundle, env


@pytest.mark.slow
def test_prepare_returns_at_once_and_the_run_waits_for_it(tmp_path: Path):
    bundle, env = stand_in_bundle(tmp_path, SNAKEFILE)
    work, out = tmp_path / "node", tmp_path / "out"
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
    prepared = (work / "prepare.log").read_text()
    assert "rule build_llamacpp" in prepared and f"rule {PREPARE_TARGET}:" in prepared  # the target, not --until


@pytest.mark.parametrize("experiment, formats", [("h100_capacity_steady", {"fp16", "fp8-online"}),
                                                 ("h100_seed_fp8_q4_p128", {"fp8-online", "f16", "q4_k_m"})])
def test_the_prepare_target_makes_every_model_and_build_before_the_gpu(experiment: str, formats: set[str]) -> None:
    """The prepare was `snakemake node --until <rules>`, under which Snakemake made the fetched source and then
    stopped ("Out of jobs ready to be started"): on an H100 node (2026-12-07) the models were left to the run call,
    and a call that needed them before it found none. The target plans them all, and nothing that needs the GPU.
    Planned from scratch (--forceall), as on a bare node, whatever this checkout has built already."""
    proc = subprocess.run([sys.executable, "-m", "snakemake", "-n", "--nolock", "--forceall", PREPARE_TARGET, "--config",
                           f"experiment={experiment}", "hardware=h100"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "BUG" not in out, out[-3000:]
    jobs = set(re.findall(r"^(?:local)?(?:rule|checkpoint) (\w+):", out, flags=re.M)) - {PREPARE_TARGET}
    assert jobs and jobs <= set(PREPARE_RULES), jobs  # models, builds and the doctor: no server, no load
    assert {"fetch_model", "fp8_online", "model_fp16"} <= jobs
    if "q4_k_m" in formats:  # the GGUF's tools are built here; the server's build waits for the doctor's GPU
        assert {"doctor", "convert_gguf", "quantize_gguf"} <= jobs and out.count("rule build_llamacpp:") == 1
    else:
        assert not jobs & {"doctor", "build_llamacpp", "fetch_llamacpp"}  # vLLM only
    made = set(re.findall(r"models/[^/\s]+/([^/\s]+)/manifest\.json", out))
    assert formats <= made, made


@pytest.mark.parametrize("experiment, builds", [("h100_capacity_steady", False), ("h100_quality_vllm", False),
                                                ("h100_seed_fp8_q4_p128", True)])
def test_a_vllm_only_record_builds_no_llamacpp_anywhere(experiment: str, builds: bool) -> None:
    """The whole DAG, not only the node's part: the pinned-versions record (rule versions, on the submit host after
    the node's results come back) read the llama.cpp build of any configured llama.cpp engine, so a vLLM-only
    record's host step would have built llama.cpp for the node's GPU on a host without one. It reads the build
    only where a variant serves or scores with it (mutant: the old input, planned here for every record)."""
    proc = subprocess.run([sys.executable, "-m", "snakemake", "-n", "--nolock", "--forceall", "--config",
                           f"experiment={experiment}", "hardware=h100"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "rule versions:" in out, out[-3000:]
    llamacpp = set(re.findall(r"^rule ((?:build|fetch)_llamacpp\w*):", out, flags=re.M))
    assert bool(llamacpp) == builds, llamacpp
