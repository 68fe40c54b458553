"""Where bakeoff's client becomes the bottleneck: the measurement behind bakeoff.loadgen.health's thresholds.

A stand-in server (bakeoff.loadgen.echo_server, in its own process so its CPU is
not the client's) streams every request at a fixed time per token, so the true
TPOT is known. The client runs closed-loop at rising concurrency. While the
client keeps up, its measured median TPOT stays at the server's; where it
exceeds it, the client is the bottleneck. Each row prints the client's CPU
share of the measured window and its event-loop lag p99 beside that TPOT
excess, which is what the saturation thresholds are read from. With ``--token-delay-ms 0`` the server costs
nothing and the rows are the client's own ceiling: the output tok/s that 1, 2 or 4 workers sustain
(``--workers 1 2 4``), with their schedule delay.

    .venv/bin/python benchmarks/client_saturation.py --token-delay-ms 10 --concurrency 1 8 32 64 128 256
    .venv/bin/python benchmarks/client_saturation.py --token-delay-ms 0 --concurrency 64 --workers 1 2 4
"""

from __future__ import annotations

import argparse
import json
import time

import psutil

from bakeoff.loadgen.cellload import CellLoad
from bakeoff.loadgen.echo_server import own_process
from bakeoff.loadgen.metrics import summarize
from bakeoff.loadgen.runner import run_cell


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--token-delay-ms", type=float, default=10.0)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--requests-per-concurrency", type=int, default=4)
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32, 64, 128, 256])
    p.add_argument("--workers", type=int, nargs="+", default=[1])
    a = p.parse_args()
    with own_process(a.token_delay_ms) as (url, pid):
        print("workers concurrency  tok/s  median_tpot_ms  tpot_excess_pct  cpu_share(max)  lag_p99_ms  "
              "sched_delay_p50/p99_ms  slot_time_lost_pct  server_cpu_share  load_avg_1m")
        proc = psutil.Process(pid)
        rows = []
        for w, c in ((w, c) for w in a.workers for c in a.concurrency):
            n = max(8, a.requests_per_concurrency * c)
            s0, t0 = sum(proc.cpu_times()[:2]), time.perf_counter()
            load = CellLoad([f"prompt {i}" for i in range(n)], prompt_len=2, output_len=a.output_len, concurrency=c,
                            warmup_prompts=["w"] * min(c, 8))
            res = run_cell(url, "m", load, show_progress=False, workers=w)
            server_share = (sum(proc.cpu_times()[:2]) - s0) / (time.perf_counter() - t0)  # warm-up included
            m = {**summarize(res.records, res.duration_s), **res.client}
            excess = 100.0 * (m["median_tpot_ms"] / a.token_delay_ms - 1.0) if a.token_delay_ms else float("nan")
            load1 = psutil.getloadavg()[0]
            row = {"workers": m["client_workers"], "concurrency": c, "output_throughput": m["output_throughput"],
                   "median_tpot_ms": m["median_tpot_ms"], "tpot_excess_pct": excess,
                   "client_cpu_share": m["client_cpu_share"], "client_loop_lag_p99_ms": m["client_loop_lag_p99_ms"],
                   "client_schedule_delay_p50_ms": m["client_schedule_delay_p50_ms"],
                   "client_schedule_delay_p99_ms": m["client_schedule_delay_p99_ms"],
                   "client_slot_time_lost_share": m["client_slot_time_lost_share"],
                   "client_cpu_s_per_1k_tokens": m["client_cpu_s_per_1k_tokens"], "server_cpu_share": server_share,
                   "load_avg_1m": load1, "failed": m["failed"]}
            rows.append(row)
            print(f"{row['workers']:7d} {c:11d} {row['output_throughput']:6.0f} {row['median_tpot_ms']:15.2f} "
                  f"{excess:16.1f} {row['client_cpu_share']:14.2f} {row['client_loop_lag_p99_ms']:11.1f} "
                  f"{row['client_schedule_delay_p50_ms']:11.1f}/{row['client_schedule_delay_p99_ms']:<11.1f} "
                  f"{100.0 * row['client_slot_time_lost_share']:18.2f} "
                  f"{server_share:16.2f} {load1:12.2f}", flush=True)
        print(json.dumps(rows))


if __name__ == "__main__":
    main()
