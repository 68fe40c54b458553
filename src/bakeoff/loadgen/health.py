"""The client's verdict on itself: was the load generator the bottleneck of a cell?

A saturated client reads tokens late, so every latency it reports is the
client's as much as the server's. The runner records the event-loop lag p99
(``client_loop_lag_p99_ms``) and the client's CPU time over the measured
window's wall time (``client_cpu_share``; 1.0 is one core, all one event loop
can use); a cell past either threshold is ``client_saturated``, with the reason.

The thresholds come from ``benchmarks/client_saturation.py --token-delay-ms 10``
on the 2-core development machine (2026-12-03, shared with other jobs: load
average 3.5-4.5): a stand-in server streaming at a known 10 ms a token, the
client closed-loop at rising concurrency c. Two runs (TPOT excess is the
measured median TPOT over the server's 10 ms):

=====  ===================================  ===================================
c      run 1: tok/s, excess, CPU, lag p99   run 2: tok/s, excess, CPU, lag p99
=====  ===================================  ===================================
1      93, +6 %, 0.03, 6.4 ms               95, +6 %, 0.03, 6.2 ms
8      710, +10 %, 0.07, 4.5 ms             722, +10 %, 0.08, 3.3 ms
16     --                                   1354, +14 %, 0.13, 8.8 ms
32     2408, +23 %, 0.18, 42.8 ms           2618, +19 %, 0.19, 7.5 ms
64     4339, +32 %, 0.26, 69.2 ms           4811, +21 %, 0.31, 44.1 ms
128    5884, +86 %, 0.32, 114.7 ms          8046, +37 %, 0.49, 68.9 ms
256    6838, +196 %, 0.34, 239.9 ms         --
=====  ===================================  ===================================

Lag p99 stayed under 9 ms while TPOT stayed within 20 % of the server's, and
was over 40 ms at every point past that: the lag threshold is 25 ms, between.
The CPU share where TPOT passed +20 % was 0.18-0.31, and against a server that
costs nothing (0 ms a token) the client topped out at about 13,000 tok/s with
a CPU share of 0.33-0.35: on this shared machine that is all its one core got.
The CPU threshold is 0.30. On an idle machine a client can use a whole core, so
0.30 may flag a healthy cell there: a false alarm costs a look, a missed one a
wrong number.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

LAG_P99_MS_MAX = 25.0
CPU_SHARE_MAX = 0.30
COLUMNS = ["client_cpu_share", "client_saturated", "client_saturated_reason"]


def verdict(client: Mapping[str, Any]) -> dict[str, Any]:
    """``client_saturated`` (bool) and its reason from the runner's client record."""
    reasons = []
    lag, share = client.get("client_loop_lag_p99_ms"), client.get("client_cpu_share")
    if lag is not None and lag == lag and lag > LAG_P99_MS_MAX:
        reasons.append(f"event-loop lag p99 {lag:.1f} ms > {LAG_P99_MS_MAX:g} ms")
    if share is not None and share == share and share > CPU_SHARE_MAX:
        reasons.append(f"client CPU {share:.2f} of the cell's wall time > {CPU_SHARE_MAX:g}")
    return {"client_saturated": bool(reasons), "client_saturated_reason": "; ".join(reasons)}
