"""This record's numbers beside the earlier one's, from the two node tarballs only (writes analysis.md).

  .venv/bin/python runs/h200-llamacpp-blocks-2026-12-04/analyze.py

Every cell's steady-state throughput is recomputed from its per-request records with bakeoff's own
definition (bakeoff.loadgen.metrics.steady_state), so the earlier record, made before the column existed,
gets it too. Format differences are paired by block on this one node (bakeoff.results.spread).
"""

from __future__ import annotations

import json
import statistics
import tarfile
import tempfile
from collections import defaultdict
from pathlib import Path

from bakeoff.loadgen.metrics import RequestRecord, steady_state
from bakeoff.results.spread import compare_paired, spread

HERE = Path(__file__).resolve().parent
EARLIER = HERE.parent / "h200-llamacpp-matrix-2026-12-04" / "node-results.tgz"


def cells(tarball: Path) -> list[dict]:
    out = []
    with tempfile.TemporaryDirectory() as tmp, tarfile.open(tarball) as t:
        t.extractall(tmp, filter="data")
        for p in sorted(Path(tmp).glob("results/raw/*/*/*/c*-p128*.json")):
            c = json.loads(p.read_text())
            recs = [RequestRecord.from_json(json.loads(line)) for line in p.with_suffix(".jsonl").read_text().splitlines()]
            c["steady"] = steady_state(recs, c["concurrency"])
            c["gpu"] = (c.get("gpu_uuids") or ["?"])[0][:12]
            out.append(c)
    return out


def main() -> None:
    now = [c for c in cells(HERE / "node-results.tgz") if c["status"] == "ok"]
    old = [c for c in cells(EARLIER) if c["status"] == "ok" and c["engine"] == "llamacpp"]
    lines = ["# This node (blocks) beside the earlier record (h200-llamacpp-matrix-2026-12-04)", "",
             "Made by `analyze.py` from `node-results.tgz` here and `../h200-llamacpp-matrix-2026-12-04/node-results.tgz`.", ""]
    by: dict[tuple, list[dict]] = defaultdict(list)
    for c in now:
        by[(c["engine"], c["format"], c["concurrency"])].append(c)
    lines += ["## Every cell across blocks, this node", "",
              "| variant | c | blocks | output tok/s per block (order) | mean | CV % | steady tok/s per block | "
              "tail share | SM MHz mean (min) | util % | J/token |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for (e, f, c), group in sorted(by.items()):
        group.sort(key=lambda x: x["block"])
        s = spread([g["output_throughput"] for g in group])
        lines.append(
            f"| {e}-{f} | {c} | {len(group)} | "
            + ", ".join(f"b{g['block']}: {g['output_throughput']:.1f} ({g['order']})" for g in group)
            + f" | {s.mean:.1f} | {'' if s.n < 2 else f'{s.cv_pct:.1f}'} | "
            + ", ".join(f"{g['steady']['steady_output_throughput']:.1f}" for g in group)
            + " | " + ", ".join(f"{g['steady']['tail_share']:.3f}" for g in group)
            + " | " + ", ".join(f"{g.get('gpu_sm_clock_mean_mhz') or 0:.0f} ({g.get('gpu_sm_clock_min_mhz') or 0:.0f})"
                                for g in group)
            + " | " + ", ".join(f"{g['gpu_util_pct']:.0f}" for g in group)
            + " | " + ", ".join(f"{g['joules_per_output_token']:.3f}" for g in group) + " |")
    lines += ["", "## Format against format, paired by block on this node", "",
              "| cell | b vs a | blocks | difference % | 95 % CI ± % | p (paired t) |", "|---|---|---|---|---|---|"]
    for c in (1, 8, 32):
        for a, b in (("f16", "q8_0"), ("f16", "q4_k_m"), ("q8_0", "q4_k_m")):
            ga = {g["block"]: g["output_throughput"] for g in by[("llamacpp", a, c)]}
            gb = {g["block"]: g["output_throughput"] for g in by[("llamacpp", b, c)]}
            blocks = sorted(set(ga) & set(gb))
            d = compare_paired([ga[k] for k in blocks], [gb[k] for k in blocks])
            lines.append(f"| c={c} p=128 | {b} vs {a} | {len(blocks)} | {d.rel_pct:+.1f} | {d.ci95_pct:.1f} | "
                         f"{'' if d.p is None else f'{d.p:.2g}'} |")
    lines += ["", "## The same cell on other nodes (the earlier record: one run a cell, GPUs named)", "",
              "| variant | c | earlier: GPU, output tok/s, steady tok/s, tail share | this node: mean (min-max) "
              "output, mean steady | earlier / this mean |", "|---|---|---|---|---|"]
    for o in sorted(old, key=lambda x: (x["format"], x["concurrency"])):
        group = by.get(("llamacpp", o["format"], o["concurrency"]), [])
        if not group:
            continue
        v = [g["output_throughput"] for g in group]
        st = [g["steady"]["steady_output_throughput"] for g in group]
        lines.append(f"| llamacpp-{o['format']} | {o['concurrency']} | {o['gpu']}, {o['output_throughput']:.1f}, "
                     f"{o['steady']['steady_output_throughput']:.1f}, {o['steady']['tail_share']:.3f} | "
                     f"{statistics.fmean(v):.1f} ({min(v):.1f}-{max(v):.1f}), {statistics.fmean(st):.1f} | "
                     f"{o['output_throughput'] / statistics.fmean(v):.3f} |")
    cache = [c for c in now if c["engine"] == "llamacpp_cacheram"]
    base = [c for c in now if c["engine"] == "llamacpp" and c["format"] == "q4_k_m" and c["concurrency"] == 32
            and c["block"] == 0]
    if cache and base:
        a, b = base[0], cache[0]
        lines += ["", "## Host prompt cache A/B (q4_k_m, c=32, p=128, block 0, same node)", "",
                  "| cache_ram | order in block | output tok/s | steady tok/s | median TTFT ms | p99 TTFT ms | "
                  "median TPOT ms | J/token |", "|---|---|---|---|---|---|---|---|"]
        for label, x in (("0 (bakeoff's setting)", a), ("engine default (8 GiB)", b)):
            lines.append(f"| {label} | {x['order']} | {x['output_throughput']:.1f} | "
                         f"{x['steady']['steady_output_throughput']:.1f} | {x['median_ttft_ms']:.0f} | "
                         f"{x['p99_ttft_ms']:.0f} | {x['median_tpot_ms']:.2f} | {x['joules_per_output_token']:.3f} |")
    (HERE / "analysis.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
