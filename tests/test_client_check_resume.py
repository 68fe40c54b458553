"""The client check continues across calls (benchmarks/client_vs_vllm_bench.py --resume): a GPU node's call limit
stops it mid-way, and a later call keeps every finished round, re-runs an unfinished one whole, and gives
``bakeoff:auto`` what the kept runs taught its sizer. Run against the echo server with bakeoff's own client."""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from bakeoff.models.synthetic import LLAMA2_7B, write_hf_tokenizer
from bakeoff.node.readme import client_check_section

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "client_vs_vllm_bench.py"


def check_module():
    spec = importlib.util.spec_from_file_location("client_vs_vllm_bench", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def args(**kw) -> argparse.Namespace:
    base = dict(prompt_len=16, output_len=8, num_requests=8, requests_per_concurrency=2, served_name="bench",
                clients=["bakeoff:1", "vllm_bench"])
    return argparse.Namespace(**{**base, **kw})


def run(c: int, r: int, pos: int, **kw) -> dict:
    return {"concurrency": c, "round": r, "position": pos, "output_throughput": 100.0 + r, "p99_tpot_ms": 10.0,
            "client_workers": 1, "client_cpu_s_per_1k_tokens": 0.05, "client_saturated": False, **kw}


def test_resume_keeps_finished_rounds_and_drops_a_round_a_client_missed() -> None:
    mod = check_module()
    report = {"settings": vars(args()),
              "runs": {"bakeoff:1": [run(512, 0, 0), run(512, 1, 1), run(512, 2, 0)],
                       "vllm_bench": [run(512, 0, 1), run(512, 1, 0)]}}  # round 2 stopped before vllm_bench ran
    kept, call = mod.resumed(report, args())
    assert {(r["concurrency"], r["round"]) for rs in kept.values() for r in rs} == {(512, 0), (512, 1)}
    assert len(kept["bakeoff:1"]) == len(kept["vllm_bench"]) == 2
    assert call == 1
    kept[next(iter(kept))][0]["call"] = 1
    assert mod.resumed({"settings": report["settings"], "runs": kept}, args())[1] == 2


@pytest.mark.parametrize(("change", "named"), [({"output_len": 256}, "output_len"),
                                                ({"clients": ["bakeoff:auto", "vllm_bench"]}, "clients")])
def test_resume_refuses_a_report_made_with_other_settings(change: dict, named: str) -> None:
    mod = check_module()
    report = {"settings": vars(args()), "runs": {"bakeoff:1": [run(64, 0, 0)], "vllm_bench": [run(64, 0, 1)]}}
    with pytest.raises(SystemExit, match=f"other {named}"):
        mod.resumed(report, args(**change))


def test_the_kept_runs_teach_auto_what_the_first_call_learned() -> None:
    """A run short of client with 2 workers at c=64 makes ``auto`` start the next c=64 run with at least 4; a
    resumed call that forgot it would start with 1."""
    mod = check_module()
    mod.SIZER = None
    from bakeoff.loadgen.sizing import ClientSizer

    assert ClientSizer().workers(64, 8) == 1
    mod.feed_sizer({"bakeoff:auto": [run(64, 0, 0, client_workers=2, client_saturated=True)],
                    "vllm_bench": [run(64, 0, 1)]})
    assert mod.SIZER.workers(64, 8) >= 4


def test_a_check_stopped_after_one_round_continues_in_a_second_call(tmp_path: Path) -> None:
    tok = tmp_path / "tok"
    tok.mkdir()
    write_hf_tokenizer(tok, LLAMA2_7B.n_vocab, LLAMA2_7B.context_length)
    common = [sys.executable, str(SCRIPT), "--model-dir", str(tok), "--echo-token-delay-ms", "1",
              "--concurrency", "4", "--clients", "bakeoff:1", "bakeoff:2", "--prompt-len", "64",
              "--output-len", "8", "--num-requests", "8"]
    first, second = tmp_path / "call0.json", tmp_path / "call1.json"
    subprocess.run([*common, "--rounds", "1", "--out", str(first)], check=True, capture_output=True, timeout=300)
    done = subprocess.run([*common, "--rounds", "2", "--resume", str(first), "--out", str(second)],
                          check=True, capture_output=True, text=True, timeout=300)
    assert "2 runs of finished rounds kept; this is call 1" in done.stderr
    before, after = json.loads(first.read_text())["runs"], json.loads(second.read_text())["runs"]
    for who in ("bakeoff:1", "bakeoff:2"):
        assert after[who][0] == before[who][0]  # round 0 kept as it was, not re-run
        assert [(r["round"], r["call"]) for r in after[who]] == [(0, 0), (1, 1)]
    note = next(line for line in client_check_section({"runs": after}) if line.startswith("Resumed"))
    assert "2 calls" in note and "call 1: c=4 round 1" in note
