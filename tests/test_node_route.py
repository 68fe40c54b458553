"""The node route: pack a checkout for a GPU node, collect what the node made, unpack it here.

Fast: no build, no server. The source tree below is hand-written (three files standing in for
llama.cpp) and run through the fetch stage's manifest format.
"""

from __future__ import annotations

import json
import re
import subprocess
import tarfile
from pathlib import Path

import pytest

from bakeoff.composition.compose import load_config
from bakeoff.engines import ServerSpec
from bakeoff.errors import BakeoffError
from bakeoff.layout import cell_name, is_cell_stem
from bakeoff.models.manifest import verify, write_manifest
from bakeoff.node.bundle import COLLECT, NODE_SH, collect, pack, unpack
from bakeoff.node.correct import correct_unpacked

from conftest import planned_jobs, snakemake

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def fetched(tmp_path: Path) -> Path:
    """A hand-written stand-in for build/llamacpp/src-<commit> (archive + extracted tree + manifest)."""
    src = tmp_path / "repo" / "build" / "llamacpp" / "src-0c1e57098"
    (src / "llama.cpp" / "ggml" / "src" / "ggml-cuda").mkdir(parents=True)
    (src / "llama.cpp" / "docs").mkdir()
    (src / "llama.cpp" / "CMakeLists.txt").write_text("project(llama)\n")
    (src / "llama.cpp" / "ggml" / "src" / "ggml-cuda" / "fattn.cu").write_text("// kernels\n")
    (src / "llama.cpp" / "docs" / "build.md").write_text("# docs\n")
    (src / "source.tar.gz").write_bytes(b"sdist")
    write_manifest(src, only=["source.tar.gz"], kind="llamacpp-source", package="llama-cpp-python",
                   version="0.3.36", commit="0c1e57098")
    return src


def _repo(root: Path) -> Path:
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    (root / "Snakefile").write_text("# wiring\n")
    (root / ".gitignore").write_text("/build/\n")
    (root / "notes.txt").write_text("untracked, not ignored: travels\n")
    (root / "runs/h200").mkdir(parents=True)
    (root / "runs/h200/node-results.tgz").write_bytes(b"an earlier node's record")
    subprocess.run(["git", "-C", str(root), "add", "Snakefile", ".gitignore", "runs"], check=True)
    subprocess.run(["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x"], check=True)
    return root


def test_pack_bundles_checkout_trimmed_source_and_wheels(fetched: Path, tmp_path: Path):
    repo = _repo(tmp_path / "repo")
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "x-1.0-py3-none-any.whl").write_bytes(b"whl")
    out = pack(repo=repo, source=Path("build/llamacpp/src-0c1e57098"), wheels=wheels, out=tmp_path / "bundle")
    assert (out / "node.sh").read_text() == NODE_SH and (out / "whl" / "x-1.0-py3-none-any.whl").exists()
    dest = tmp_path / "node"
    with tarfile.open(out / "repo.tgz") as tar:
        names = set(tar.getnames())
        tar.extractall(dest, filter="data")
    assert {"Snakefile", "notes.txt", ".gitignore", "node.json"} <= names
    assert not any(n.startswith("runs/") for n in names)  # committed records stay home
    tree = dest / "build/llamacpp/src-0c1e57098"
    assert (tree / "llama.cpp/ggml/src/ggml-cuda/fattn.cu").exists()
    assert not (tree / "llama.cpp/docs").exists()  # trimmed
    m = verify(tree)  # the node's build stage verifies exactly what it compiles
    assert m["commit"] == "0c1e57098" and m["trimmed_from_sha256"] and "docs/*" in m["trimmed"]
    assert {f["path"] for f in m["files"]} == {"llama.cpp/CMakeLists.txt", "llama.cpp/ggml/src/ggml-cuda/fattn.cu"}
    # the carried tree predates whatever the node builds from it
    assert (tree / "manifest.json").stat().st_mtime < 10**9
    info = json.loads((dest / "node.json").read_text())
    assert len(info["git_sha"]) == 40 and info["git_dirty"] is True


def test_collect_then_unpack_round_trip_keeps_only_node_results(tmp_path: Path):
    node = tmp_path / "node"
    cells = node / "results/raw/h200_llamacpp/m/llamacpp-f16"
    cells.mkdir(parents=True)
    (cells / "cells.json").write_text("{}")
    (cells / "server.log").write_text("log\n")
    (node / "models/m/f16").mkdir(parents=True)
    (node / "models/m/f16/manifest.json").write_text("{}")
    (node / "models/m/f16/model.gguf").write_bytes(b"weights stay on the node")
    (node / "results/kernel/m").mkdir(parents=True)
    (node / "results/kernel/m/f16-faon.json").write_text("{}")
    names = collect(node, tmp_path / "out.tgz")
    assert "models/m/f16/model.gguf" not in names
    assert {"results/raw/h200_llamacpp/m/llamacpp-f16/cells.json", "models/m/f16/manifest.json",
            "results/kernel/m/f16-faon.json"} <= set(names)
    here = tmp_path / "here"
    assert sorted(unpack(tmp_path / "out.tgz", here)) == sorted(names)
    assert (here / "results/raw/h200_llamacpp/m/llamacpp-f16/server.log").read_text() == "log\n"


def test_unpack_refuses_paths_outside_node_results(tmp_path: Path):
    bad = tmp_path / "bad.tgz"
    (tmp_path / "Snakefile").write_text("overwritten?\n")
    with tarfile.open(bad, "w:gz") as tar:
        tar.add(tmp_path / "Snakefile", arcname="Snakefile")
    with pytest.raises(BakeoffError, match="not a node result path"):
        unpack(bad, tmp_path / "here")
    assert "Snakefile" not in COLLECT


def _rows(root: Path) -> list[tuple[str, dict]]:
    """Every row (cell, capacity result, probe) and variant in the unpacked serving results, with its file."""
    out = []
    for p in sorted((root / "results/raw").rglob("*.json")):
        data = json.loads(p.read_text())
        rel = p.relative_to(root).as_posix()
        if "cell" in data:
            out.append((rel, data))
        out += [(rel, r) for key in ("cells", "capacity", "probes") for r in data.get(key, [])]
        if isinstance(data.get("variant"), dict):
            out.append((rel, data["variant"]))
    return out


def test_unpack_names_the_nodes_gpu_where_the_run_config_named_another(tmp_path: Path):
    """The H100 record ran under the h200 config: unpacked, its rows and the doctor's record name the H100, so
    the summary and the pages made from them do; nothing measured changes, and the node's mtimes stay."""
    tarball = ROOT / "runs/h100-seed-2026-12-06/node-results.tgz"
    raw, fixed = tmp_path / "raw", tmp_path / "fixed"
    unpack(tarball, raw, correct=False)
    names = unpack(tarball, fixed)
    before, after = _rows(raw), _rows(fixed)
    assert len(after) == len(before) > 100 and {r["hardware"] for _, r in before} == {"h200"}
    assert {r["hardware"] for _, r in after} == {"h100"}
    rows = [r for _, r in after if "cell" in r]
    assert len(rows) > 60 and all(
        (r["gpu_name"], r["gpu_count"], r["gpu_memory_bytes"]) == ("NVIDIA H100 80GB HBM3", 1, 85520809984) for r in rows)
    for (f, old), (g, new) in zip(before, after, strict=True):
        assert f == g and {k: v for k, v in new.items() if k not in ("hardware", "gpu_name", "gpu_count",
                                                                     "gpu_memory_bytes")} == {
            k: v for k, v in old.items() if k != "hardware"}, f
    hw = json.loads((fixed / "results/hardware.json").read_text())
    assert hw["hardware_config"]["name"] == "h100" and hw["hardware_config_as_run"]["name"] == "h200"
    assert "NVIDIA H200" in hw["hardware_config_note"] and "bakeoff node unpack" in hw["hardware_config_note"]
    assert hw["gpus"] == json.loads((raw / "results/hardware.json").read_text())["gpus"]
    with tarfile.open(tarball) as tar:
        mtimes = {m.name: m.mtime for m in tar.getmembers() if m.isfile()}
    assert all(abs((fixed / n).stat().st_mtime - mtimes[n]) < 1e-3 for n in names)
    untouched = [n for n in names if not n.endswith(".json")]
    assert untouched and all((fixed / n).read_bytes() == (raw / n).read_bytes() for n in untouched)
    assert correct_unpacked(fixed) is None  # once corrected, the config describes the node


def test_unpack_leaves_a_run_whose_config_named_its_gpu_as_the_node_wrote_it(tmp_path: Path):
    tarball = ROOT / "runs/h200-llamacpp-blocks-2026-12-04/node-results.tgz"
    names = unpack(tarball, tmp_path / "here")
    with tarfile.open(tarball) as tar:
        for n in names:
            if n.endswith(".json"):
                assert (tmp_path / "here" / n).read_bytes() == tar.extractfile(n).read(), n


def test_the_unpack_command_says_what_it_corrected(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    from bakeoff.cli import main

    main(["node", "unpack", str(ROOT / "runs/h100-seed-p1024-2026-12-06/node-results.tgz"), "--repo", str(tmp_path)])
    out = capsys.readouterr().out
    assert "the run's hardware config (h200) does not describe the node" in out and "hardware=h100" in out
    assert "hardware=auto" in out
    assert {r["hardware"] for _, r in _rows(tmp_path)} == {"h100"}


def test_node_target_plans_only_node_jobs():
    """`snakemake node` on the H200 config: doctor, build, models, serving, kernel benchmarks; no bookkeeping."""
    import os
    import sys

    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = subprocess.run([str(bin_dir / "snakemake"), "-n", "--forceall", "node", "--config", "experiment=h200_llamacpp"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    jobs = {line.split()[0] for line in proc.stdout.split("Job stats:")[1].split("total")[0].splitlines()[3:]
            if line.strip()}
    assert {"doctor", "build_llamacpp", "serve_load", "kernel_bench", "quantize_gguf"} <= jobs
    assert not jobs & {"summary", "track", "plots", "pages", "samples"}


def test_record_of_the_h200_run_derives_its_committed_tables(tmp_path: Path):
    """The committed run record is what `bakeoff node record` derives from the committed tarball."""
    from bakeoff.node.record import record

    for name in ("h200-llamacpp-matrix-2026-12-04", "h200-llamacpp-blocks-2026-12-04"):
        run = ROOT / "runs" / name
        paths = record(run / "node-results.tgz", tmp_path / name)
        for file in ("cells.csv", "kernel.csv", "table.md", "server-log-ends.txt", "hardware.json"):
            assert paths[file].read_text() == (run / file).read_text(), (name, file)
    # Two configs of one engine are two rows: --parallel 32 and --parallel 4 at c=32 are not mixed up.
    table = (ROOT / "runs/h200-llamacpp-matrix-2026-12-04/table.md").read_text().split("\n\n")[0]
    rows = {tuple(c.strip() for c in line.split("|")[1:4]): line for line in table.splitlines()}
    assert rows[("llamacpp --parallel 32", "q4_k_m", "128")].endswith("0.19 |")
    assert rows[("llamacpp_np4 --parallel 4", "q4_k_m", "128")].endswith("0.70 |")


def test_a_cell_keeps_its_config_engine_name_over_the_plugins():
    """Two configs of one plugin (llamacpp and llamacpp_np4) stay two engines in every cell and summary row."""
    from bakeoff.engines import get_engine
    from bakeoff.loadgen.cells import Cell, record_base

    spec = ServerSpec(engine=load_config(["experiment=h200_llamacpp"]).engines["llamacpp_np4"],
                      hardware=load_config(["experiment=h200_llamacpp"]).hardware, model_dir=Path("/nonexistent"),
                      served_name="m", log_path=Path("/nonexistent/server.log"), toolchain_dir=None)
    versions = get_engine("llamacpp")(spec).versions()
    assert versions["engine"] == "llamacpp"
    row = record_base({"engine": "llamacpp_np4", "format": "q4_k_m"}, Cell(32, 128, 0), 100, versions, None)
    assert row["engine"] == "llamacpp_np4" and row["engine_version"] == versions["engine_version"]


def test_pack_resume_carries_only_finished_cells_and_names_their_tarball(fetched: Path, tmp_path: Path):
    prior = tmp_path / "prior"
    variant = prior / "results/raw/h200_llamacpp/m/llamacpp-q8_0"
    variant.mkdir(parents=True)
    for name in ("c1-p1024.json", "c1-p1024.jsonl", "c8-p128-r2.json", "cells.json", "quality.json", "server.log"):
        (variant / name).write_text(name)
    (prior / "results/hardware.json").write_text("{}")
    collect(prior, tmp_path / "node-results.tgz")
    repo = _repo(tmp_path / "repo")
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    out = pack(repo=repo, source=Path("build/llamacpp/src-0c1e57098"), wheels=wheels, out=tmp_path / "bundle",
               resume=[tmp_path / "node-results.tgz"])
    dest = tmp_path / "node"
    with tarfile.open(out / "repo.tgz") as tar:
        tar.extractall(dest, filter="data")
    carried = sorted(p.name for p in (dest / "results/raw/h200_llamacpp/m/llamacpp-q8_0").iterdir())
    # the index, quality, logs are remade on the node; the doctor's record too
    assert carried == ["c1-p1024.json", "c1-p1024.jsonl", "c8-p128-r2.json"]
    assert not (dest / "results/hardware.json").exists()
    info = json.loads((dest / "node.json").read_text())
    assert info["resumed_from"][0]["tarball"] == "node-results.tgz" and len(info["resumed_from"][0]["sha256"]) == 64
    assert info["resumed_from"][0]["cells"] == ["results/raw/h200_llamacpp/m/llamacpp-q8_0/c1-p1024.json",
                                                "results/raw/h200_llamacpp/m/llamacpp-q8_0/c8-p128-r2.json"]
    empty = tmp_path / "empty.tgz"
    collect(tmp_path / "repo", empty)
    with pytest.raises(BakeoffError, match="no finished cells"):
        pack(repo=repo, source=Path("build/llamacpp/src-0c1e57098"), wheels=wheels, out=tmp_path / "b2", resume=[empty])


def test_cell_stems_are_told_from_other_files():
    assert is_cell_stem(cell_name(8, 128)) and is_cell_stem(cell_name(32, 1024, 2))
    assert not any(is_cell_stem(s) for s in ("cells", "quality", "samples", "server", "c8-p128-r0", "c8"))


def _planned_threads(cores: int) -> dict[str, int]:
    """rule -> threads of its planned job in a dry run of `snakemake node` on the H200 config (1 when not printed)."""
    out = snakemake("-n", "--forceall", "--cores", str(cores), "node", "--config", "experiment=h200_llamacpp").stdout
    return {rule: int(fields.get("threads", 1)) for rule, fields in planned_jobs(out)}


def test_a_fresh_node_makes_the_model_beside_the_compile():
    """The compile claims all cores but one, so the one-thread source and f16 jobs need not wait for it, on 16
    cores as on 2; a job that measures (a server, llama-bench) claims every core, so it never runs beside it."""
    for cores in (16, 2):
        node = _planned_threads(cores)
        assert node["build_llamacpp"] == cores - 1
        assert node["fetch_model"] == node["convert_gguf"] == 1
        assert node["build_llamacpp"] + node["fetch_model"] <= cores
        for measuring in ("serve_load", "kernel_bench"):
            assert node[measuring] == cores < node["build_llamacpp"] + node[measuring], measuring


def test_the_compile_runs_on_every_core_it_was_given():
    """On 2 cores the build claims one, and still compiles with 2 processes: alone it uses both."""
    out = snakemake("-n", "-p", "--forceall", "--cores", "2", "build/llamacpp/0c1e57098-cpu/manifest.json").stdout
    assert dict(planned_jobs(out))["build_llamacpp"].get("threads", "1") == "1"
    jobs = re.search(r"bakeoff stage build-llamacpp .* --jobs \$\(\( (\d+) \+ 1 \)\) ", out)
    assert jobs and int(jobs.group(1)) + 1 == 2, out[-2000:]


def test_a_node_serves_a_ready_model_before_making_the_next():
    """Every job after the build takes all cores, so they run one at a time: the greedy scheduler starts the
    highest priority first. Serving outranks quantizing and llama-bench, so a call cut off by its time limit
    has spent its minutes on cells (the gate before servers outranks both)."""
    out = snakemake("-n", "--forceall", "--cores", "16", "node", "--config", "experiment=h200_llamacpp").stdout
    prio: dict[str, set[int]] = {}
    for rule, fields in planned_jobs(out):
        prio.setdefault(rule, set()).add(int(fields.get("priority", 0)))
    assert min(prio["gpu_check"]) > max(prio["serve_load"]) > max(prio["quantize_gguf"] | prio["kernel_bench"])
