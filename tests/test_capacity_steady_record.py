"""runs/h100-capacity-steady-2026-12-07: the README's claims are what its files show.

Its table is what ``steady.py`` prints from the tarball; each capacity is a bracket with its rule and start, and
both re-checks disagreed; where a multi-worker client read about 7 % fewer tokens a second than `vllm bench serve`,
the server's own inter-token latency was the same (the client measured slower than the server served)."""

from __future__ import annotations

import json
import statistics
import tarfile

from bakeoff.node.readme import section_of

from conftest import ROOT, record_table

RUN = ROOT / "runs" / "h100-capacity-steady-2026-12-07"
RAW = "results/raw/h100_capacity_steady/llama2-7b-synthetic"


def test_the_readme_table_is_what_steady_py_prints() -> None:
    committed, printed = record_table(RUN, "steady.py")
    assert committed == printed


def test_each_capacity_is_an_uncertain_bracket_judged_confident_over_a_ramp() -> None:
    with tarfile.open(RUN / "node-results.tgz") as tar:
        caps = {v: json.load(tar.extractfile(f"{RAW}/{v}/capacity.json"))["capacity"][0]  # type: ignore[arg-type]
                for v in ("vllm-fp8-online", "vllm-fp16")}
    assert {v: c["concurrency_bracket"] for v, c in caps.items()} == {"vllm-fp8-online": "176–184",
                                                                      "vllm-fp16": "148–152"}
    for c in caps.values():
        assert c["capacity_verdict_rule"] == "confident" and c["capacity_start"] == "ramp"
        assert c["concurrency_uncertain"] and c["binding_concurrency"] == "ttft"
        assert c["p99_tpot_ms_at_capacity"] < c["slo_tpot_ms"] / 1.8
    section = section_of((RUN / "README.md").read_text()) or ""
    assert "| vllm-fp8-online | interactive | 176–184, converged; uncertain, re-checks 176: pass, fail; 184: fail, fail |" \
        in section


def test_where_a_client_read_slower_the_server_had_not_run_slower() -> None:
    runs = json.loads((RUN / "client_check.json").read_text())["runs"]
    assert {r["concurrency"] for rs in runs.values() for r in rs} == {256}
    assert all(len(rs) == 3 for rs in runs.values())
    slow = []
    for who, rs in runs.items():
        for r in rs:
            ref = next(v for v in runs["vllm_bench"] if v["round"] == r["round"])
            assert abs(r["server_mean_itl_ms"] / ref["server_mean_itl_ms"] - 1) < 0.015, (who, r["round"])
            if r["output_throughput"] / ref["output_throughput"] < 0.95:
                slow.append((who, r["round"], r.get("client_workers")))
    assert len(slow) == 3 and all(w and w > 1 for _, _, w in slow), slow


def test_runs_read_slow_with_several_workers_and_once_with_vllms_own_client_never_with_one_worker() -> None:
    """The README's count: runs more than 5 % below the median of `vllm bench serve`'s three, by client."""
    runs = json.loads((RUN / "client_check.json").read_text())["runs"]
    ref = statistics.median(r["output_throughput"] for r in runs["vllm_bench"])
    assert round(ref) == 12222
    every = [(r.get("client_workers") or 0, r["output_throughput"] / ref < 0.95) for rs in runs.values() for r in rs]
    one, several, vllms = ([s for w, s in every if pick(w)] for pick in (lambda w: w == 1, lambda w: w > 1,
                                                                            lambda w: w == 0))
    assert (sum(one), len(one)) == (0, 4) and (sum(several), len(several)) == (4, 5) and (sum(vllms), len(vllms)) == (1, 3)
    slow_ref = min(runs["vllm_bench"], key=lambda r: r["output_throughput"])
    assert round(slow_ref["output_throughput"]) == 11173 and slow_ref["round"] == 2
    assert round(slow_ref["server_mean_itl_ms"], 2) == 18.54


def test_the_failing_c192_probes_did_not_send_in_waves() -> None:
    """The README's reading of steady.py's last columns: at c=192 both variants failed with their sends spread more
    evenly than a Poisson stream's (variance below the mean), so the TTFT's swings are not the client's bunching."""
    _, printed = record_table(RUN, "steady.py")
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in printed.splitlines() if "`cap-" in line]
    c192 = [r for r in rows if r[2] == "192"]
    assert len(c192) == 2 and all(r[-1] == "fail" and float(r[-3]) < 1.0 for r in c192)
    assert max(float(r[-3]) for r in rows if r[-1] == "pass") > 3.0


def test_no_probe_saw_a_request_waiting_in_vllms_scheduler() -> None:
    """The README's reading of the /metrics column: every probe polled, none waiting at any poll."""
    _, printed = record_table(RUN, "steady.py")
    polls = [line.split("|")[-3].strip() for line in printed.splitlines() if "`cap-" in line]
    assert len(polls) == 19
    for cell in polls:
        scrapes, peaks = cell.split(": ")
        assert int(scrapes) >= 20 and peaks.split(", ")[1] == "0", cell
