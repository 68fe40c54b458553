"""The README's table of how each probe's TTFT moved over its steady span, from the tarball's per-request files,
and what vLLM's own stats lines logged (python3 steady.py)."""

from __future__ import annotations

import json
import re
import statistics
import tarfile
from pathlib import Path

HERE = Path(__file__).parent
RAW = "results/raw/h100_capacity_steady/llama2-7b-synthetic"
STATS = re.compile(r"Running: (\d+) reqs, Waiting: (\d+) reqs")


def _ms(values: list[float]) -> str:
    return f"{1000 * statistics.median(values):.0f}" if values else ""


def _dispersion(sends: list[float], window_s: float = 0.05) -> float:
    """Variance over mean of the requests sent in each window: 1 for a Poisson stream, above it where the users
    send in bunches (waves), below it where they are spread more evenly than at random."""
    counts = [0] * int((sends[-1] - sends[0]) / window_s)
    for t in sends:
        k = int((t - sends[0]) / window_s)
        if k < len(counts):
            counts[k] += 1
    return statistics.pvariance(counts) / statistics.mean(counts)


def table() -> str:
    out = ["| variant | probe | c | after the ramp | p99 TTFT ms | TTFT median ms, first second after the ramp | "
           "TTFT median ms, last second | sends a 50 ms window after the ramp, variance / mean | "
           "/metrics polls: peak running, peak waiting | verdict |", "|---|---|---|---|---|---|---|---|---|---|"]
    logs = {}
    with tarfile.open(HERE / "node-results.tgz") as tar:
        for variant in ("vllm-fp8-online", "vllm-fp16"):
            cap = json.load(tar.extractfile(f"{RAW}/{variant}/capacity.json"))  # type: ignore[arg-type]
            for p in cap["probes"]:
                rows = [json.loads(line) for line in tar.extractfile(f"{RAW}/{variant}/{p['cell']}.jsonl")]  # type: ignore[union-attr]
                steady = sorted((r["start"], r["ttft"]) for r in rows if not r["ramp"] and r["success"])
                t0, t1 = steady[0][0], steady[-1][0]
                first = [t for s, t in steady if s < t0 + 1.0]
                last = [t for s, t in steady if s > t1 - 1.0]
                out.append(f"| {variant} | `{p['cell']}` | {p['concurrency']} | {p['steady_requests']} | "
                           f"{p['p99_ttft_ms']:.0f} | {_ms(first)} | {_ms(last)} | {_dispersion([s for s, _ in steady]):.2f} | "
                           f"{p['metrics_scrapes']}: {p['peak_running_requests']:.0f}, {p['peak_waiting_requests']:.0f} | "
                           f"{'pass' if p['probe_passed'] else 'fail'} |")
            logs[variant] = [tuple(map(int, m.groups())) for m in
                             STATS.finditer(tar.extractfile(f"{RAW}/{variant}/server.log").read().decode())]  # type: ignore[union-attr]
    out.append("")
    for variant, stats in logs.items():
        out.append(f"- {variant}'s `server.log`: {len(stats)} stats lines (vLLM logs one each 10 s); Running up to "
                   f"{max(r for r, _ in stats)} requests; Waiting above 0 in {sum(w > 0 for _, w in stats)} of them.")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    print(table(), end="")
