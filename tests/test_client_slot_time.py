"""A closed loop's schedule delay judged by the slot-time it lost, not by its p99 (bakeoff.loadgen.health).

Against the echo server: a burst's first wave is sent one request after another, so its delay p99 can be tens of
milliseconds while the load it held back is a fraction of a percent; where sending that wave takes a real part of
the cell, the share lost is large, and that is what flags it.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from bakeoff.loadgen import health
from bakeoff.loadgen.cellload import CellLoad
from bakeoff.loadgen.echo_server import serving
from bakeoff.loadgen.runner import run_cell


def test_a_closed_loop_is_judged_by_its_share_lost_and_an_open_loop_by_its_delay_p99() -> None:
    calm = {"loop_lag_p99_ms": 1.0, "cpu_share": 0.2}
    one_stretch = {**calm, "worker": 0, "loop": "closed", "schedule_delay_p99_ms": 191.0, "slot_time_lost_share": 0.004}
    assert health.verdict([one_stretch])["client_saturated"] is False  # the H100 cell at c=256: not held back
    held = {**one_stretch, "worker": 1, "slot_time_lost_share": 0.03}
    v = health.verdict([one_stretch, held])
    assert v["client_saturated"] and v["client_saturated_reason"] == "worker 1: slot-time lost to schedule delay 0.030 > 0.02"
    at = {**one_stretch, "slot_time_lost_share": health.SLOT_TIME_LOST_MAX}
    assert health.verdict([at])["client_saturated"] is False  # the threshold itself passes
    open_loop = {**calm, "worker": 0, "loop": "open", "schedule_delay_p99_ms": 90.0, "slot_time_lost_share": None}
    assert "schedule delay p99 90.0 ms > 40 ms" in health.verdict([open_loop])["client_saturated_reason"]
    cols = health.cell_health([one_stretch, held])
    assert cols["client_slot_time_lost_share"] == 0.03 and cols["client_schedule_delay_p99_ms"] == 191.0


def test_a_bursts_first_wave_is_its_delay_p99_and_costs_a_sliver_of_its_slot_time() -> None:
    # 4 rounds of 256 tokens at 10 ms: slots of about 10 s, so sending the wave (a few tens of milliseconds, more
    # on a busy CI machine) stays a sliver of them
    c, n = 128, 512
    with serving(token_delay_s=0.01) as url:  # the warm-up opens the c connections the first wave uses
        res = run_cell(url, "m", CellLoad([f"p {i}" for i in range(n)], 2, 256, concurrency=c,
                                          warmup_prompts=["w"] * c), show_progress=False)
    (h,) = json.loads(res.client["client_worker_health"])
    by_start = sorted(res.records, key=lambda r: r.start)
    first, rest = by_start[:c], by_start[c:]
    assert all(r.schedule_delay is not None for r in res.records)
    first_d, rest_d = [r.schedule_delay for r in first], [r.schedule_delay for r in rest]
    # the delay is the first wave's: a refill goes out in the loop's step that saw its slot free (bar a rare
    # stall: a thread switch to the server's thread here, a GC pause), the wave's sends one after another
    assert np.mean(first_d) > 10 * np.mean(rest_d) and np.percentile(rest_d, 90) < 0.001
    # the share is the delays over the slots' time: c slots from t0 to the worker's last response
    wall = max(r.done for r in res.records if r.done is not None)
    # (the worker's figure is rounded to 4 decimals: bakeoff.loadgen.health)
    assert h["slot_time_lost_share"] == pytest.approx(sum(r.schedule_delay for r in res.records) / (c * wall), rel=0.05,
                                                      abs=0.5e-4)
    assert h["loop"] == "closed" and res.client["client_slot_time_lost_share"] < health.SLOT_TIME_LOST_MAX / 2
    assert "schedule delay" not in res.client["client_saturated_reason"]


def test_a_client_that_holds_load_back_is_flagged_by_the_slot_time_it_lost() -> None:
    """256 users, one request each, of a few milliseconds: the client sends them one after another (on the
    connections the warm-up opened), which takes longer than one request lasts, so the server never had c
    requests to serve."""
    c = 256
    with serving(token_delay_s=0.001) as url:
        res = run_cell(url, "m", CellLoad([f"p {i}" for i in range(c)], 2, 2, concurrency=c,
                                          warmup_prompts=["w"] * c), show_progress=False)
    assert res.client["client_slot_time_lost_share"] > 2 * health.SLOT_TIME_LOST_MAX
    assert "slot-time lost to schedule delay" in res.client["client_saturated_reason"]
