"""`bakeoff timings`: the rules' benchmark files summed by rule (docs/development.md's Timings)."""

from __future__ import annotations

from pathlib import Path

from bakeoff.results.timings import markdown, table

HEADER = "s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time\n"


def _bench(root: Path, rel: str, wall: float, cpu: float) -> None:
    """A benchmark file in the layout and columns Snakemake writes (values written here, not recorded)."""
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(HEADER + f"{wall}\t0:00:00\t1\t1\t1\t1\t0\t0\t1\t{cpu}\n")


def test_jobs_are_summed_by_rule_longest_first(tmp_path: Path) -> None:
    _bench(tmp_path, "results/raw/smoke/m/vllm-fp16.tsv", 300, 250)
    _bench(tmp_path, "results/raw/smoke/m/llamacpp-f16.tsv", 120, 200)
    _bench(tmp_path, "build/llamacpp/abc-cpu.tsv", 330, 600)
    _bench(tmp_path, "build/llamacpp-python/abc-cpu.tsv", 12, 10)
    _bench(tmp_path, "models/m/fp16.tsv", 30, 25)
    _bench(tmp_path, "models/m/q4_k_m.tsv", 30, 50)
    rows = table(tmp_path)
    assert rows[0] == ("serve_load", 2, 420.0, 450.0)
    assert rows[1] == ("build_llamacpp", 1, 330.0, 600.0)
    assert ("model preparation", 2, 60.0, 75.0) in rows and ("build_llamacpp_python", 1, 12.0, 10.0) in rows
    md = markdown(tmp_path)
    assert "| serve_load | 2 | 7.0 | 51% | 7.5 |" in md and "| **all benchmarked jobs** | 6 | 13.7 |" in md
