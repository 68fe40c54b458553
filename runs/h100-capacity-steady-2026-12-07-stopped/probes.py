"""The table of this folder's README: each probe file's numbers, as the node wrote them (python3 probes.py)."""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).parent
CONFIDENT_MIN = 299  # the fewest requests with which the confident rule can pass (bakeoff.loadgen.capacity)


def table() -> str:
    rows = [json.loads(p.read_text()) for p in sorted((HERE / "probes").glob("*.json"))]
    rows.sort(key=lambda r: (r.get("probe_of") is not None, -r["concurrency"]))
    out = ["| cell | start | c | sent | in the ramp | after the ramp (`steady_requests`) | p99 TTFT ms | p99 TPOT ms | "
           "95 % bound on the share over TTFT / TPOT | verdict | exceeded | seconds |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        steady, sent = r["steady_requests"], r["num_requests"]
        verdict = "" if r.get("probe_of") is None else ("pass" if r["probe_passed"] else "fail")
        bounds = ("" if r.get("probe_of") is None else
                  f"{100 * r['over_ttft_share_ub95']:.4f} % / {100 * r['over_tpot_share_ub95']:.4f} %")
        out.append(f"| `{r['cell']}` | {r['load_start']} | {r['concurrency']} | {sent} | {sent - steady} | {steady}"
                   f"{' (< ' + str(CONFIDENT_MIN) + ')' if r.get('probe_of') and steady < CONFIDENT_MIN else ''} | "
                   f"{r['p99_ttft_ms']:.1f} | {r['p99_tpot_ms']:.2f} | {bounds} | {verdict} | "
                   f"{r.get('probe_exceeded') or ''} | {r['duration_s']:.1f} |")
    starts = {r["server_start_id"]: r["startup_s"] for r in rows}
    first = rows[0]
    out += ["", "Server starts: " + "; ".join(f"`{k}` {v:.1f} s" for k, v in starts.items()) + f". {first['gpu_name']}, "
            f"driver {first['gpu_driver']}; vLLM {first['engine_version']}, torch {first['torch']}; "
            f"SLO `{rows[-1].get('slo')}`."]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    print(table(), end="")
