"""runs/h100-capacity-steady-2026-12-07-stopped: a stopped run's notes are their files.

Its README's table is what ``probes.py`` prints from the probe files, and its prose claims what they show: every
ramped probe read fewer than the 299 requests the confident rule needs, with every p99 within ``interactive``'s
bounds, so the fail was the probe's size (the defect fixed in bakeoff.loadgen.workers: the steady cap).
"""

from __future__ import annotations

import json

from bakeoff.loadgen.capacity import MIN_CONFIDENT_REQUESTS, SLO_PRESETS, TOO_FEW, judge

from conftest import ROOT, record_table

RUN = ROOT / "runs" / "h100-capacity-steady-2026-12-07-stopped"


def test_the_readme_table_is_what_the_probe_files_print() -> None:
    committed, printed = record_table(RUN, "probes.py")
    assert committed == printed


def test_every_probe_failed_on_its_size_alone_and_passes_judged_today() -> None:
    slo = SLO_PRESETS["interactive"]
    probes = [json.loads(p.read_text()) for p in (RUN / "probes").glob("cap-*.json")]
    assert len(probes) == 6
    for r in probes:
        assert r["load_start"] == "ramp" and not r["probe_passed"] and r["failed"] == 0
        assert r["num_requests"] - r["steady_requests"] > r["concurrency"]  # the ramp sent more than one a slot
        assert r["steady_requests"] < MIN_CONFIDENT_REQUESTS <= r["num_requests"] - r["concurrency"]
        assert r["p99_ttft_ms"] < slo.ttft_ms and r["p99_tpot_ms"] < slo.tpot_ms
        assert r["over_ttft_share"] == r["over_tpot_share"] == 0.0
        assert judge(r, slo, rule="confident").exceeded == (TOO_FEW,)  # what the verdict now says
        assert judge({**r, "steady_requests": MIN_CONFIDENT_REQUESTS}, slo, rule="confident").passed
