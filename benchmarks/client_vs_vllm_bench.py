"""bakeoff's load client vs vLLM's own `vllm bench serve`, side by side in one run, with vLLM as referee.

Both clients drive the *same* vLLM server with the *same* prompts in a round
(bakeoff's exact-length random prompts, handed to vLLM's ``benchmark()`` as its
SampleRequests; prefix caching off, so the second client gains nothing from the
first), the same concurrency, output length, ignore_eos and temperature 0.
Rounds alternate which client goes first; each round gives one paired ratio
(bakeoff / vllm bench), and the report gives the median and range of those.

The referee is the server's own view of each run: vLLM's /metrics histograms
(``vllm:time_to_first_token_seconds``, ``vllm:inter_token_latency_seconds``,
``vllm:request_time_per_output_token_seconds``) read before and after it, so
their sums and counts give the server-side means of that run alone. Where the
server's ratio matches the clients', the server really ran at that speed under
that client's traffic; where it does not, the clients measure differently.

Client CPU is the benchmarking process's own user+sys time (getrusage) around
each client's measured run -- both run in this one process, one at a time.

    .venv/bin/python benchmarks/client_vs_vllm_bench.py --rounds 10

Targets (from the serving issue): output tok/s within +-3%, median TTFT and
TPOT within +-5%, bakeoff's client CPU per 1k tokens <= 0.5x vllm bench's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


REFEREE = {"server_mean_ttft_ms": "vllm:time_to_first_token_seconds",
           "server_mean_itl_ms": "vllm:inter_token_latency_seconds",
           "server_mean_tpot_ms": "vllm:request_time_per_output_token_seconds"}


def server_histograms(base_url: str) -> dict[str, float]:
    """Every ``_sum`` and ``_count`` sample of vLLM's /metrics page, summed over label sets."""
    import requests

    from bakeoff.loadgen.scrape import gauges

    return gauges(requests.get(base_url + "/metrics", timeout=10).text)


def referee(before: dict[str, float], after: dict[str, float]) -> dict[str, float | None]:
    """The server-side means over one run: (sum after - sum before) / (count after - count before), in ms."""
    out: dict[str, float | None] = {}
    for key, name in REFEREE.items():
        n = after.get(name + "_count", 0.0) - before.get(name + "_count", 0.0)
        out[key] = 1000 * (after.get(name + "_sum", 0.0) - before.get(name + "_sum", 0.0)) / n if n else None
    return out


def cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


async def run_vllm_bench(base_url: str, model: str, tok, prompts: list[str], prompt_len: int, output_len: int,
                         concurrency: int) -> dict:
    from vllm.benchmarks.datasets.datasets import SampleRequest
    from vllm.benchmarks.serve import TaskType, benchmark

    reqs = [SampleRequest(prompt=p, prompt_len=prompt_len, expected_output_len=output_len) for p in prompts]
    c0 = cpu_s()
    r = await benchmark(task_type=TaskType.GENERATION, endpoint_type="vllm", api_url=base_url + "/v1/completions",
                        base_url=base_url, model_id=model, model_name=model, tokenizer=tok, input_requests=reqs,
                        logprobs=None, request_rate=float("inf"), burstiness=1.0, disable_tqdm=True, num_warmups=0,
                        profile=False, selected_percentile_metrics=["ttft", "tpot", "itl", "e2el"],
                        selected_percentiles=[99.0], ignore_eos=True, goodput_config_dict={},
                        max_concurrency=concurrency, lora_modules=None, extra_headers=None,
                        extra_body={"temperature": 0.0})
    cpu = cpu_s() - c0
    return {"output_throughput": r["output_throughput"], "median_ttft_ms": r["median_ttft_ms"],
            "median_tpot_ms": r["median_tpot_ms"], "cpu_s": cpu, "tokens": r["total_output_tokens"],
            "completed": r["completed"]}


async def run_bakeoff(base_url: str, model: str, prompts: list[str], prompt_len: int, output_len: int,
                      concurrency: int) -> dict:
    from bakeoff.loadgen.metrics import summarize
    from bakeoff.loadgen.runner import run_cell_async

    c0 = cpu_s()
    res = await run_cell_async(base_url=base_url, model=model, prompts=prompts, prompt_len=prompt_len,
                               output_len=output_len, concurrency=concurrency, show_progress=False)
    cpu = cpu_s() - c0
    m = summarize(res.records, res.duration_s)
    return {"output_throughput": m["output_throughput"], "median_ttft_ms": m["median_ttft_ms"],
            "median_tpot_ms": m["median_tpot_ms"], "cpu_s": cpu, "tokens": m["total_output_tokens"],
            "completed": m["completed"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-dir", default=str(ROOT / "models" / "smollm2-135m" / "fp16"))
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--num-requests", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "out" / "client_vs_vllm_bench.json"))
    a = ap.parse_args()

    from transformers import AutoTokenizer

    from bakeoff.composition.compose import load_config
    from bakeoff.engines import ServerSpec, get_engine
    from bakeoff.loadgen.prompts import make_prompts

    cfg = load_config([])
    tok = AutoTokenizer.from_pretrained(a.model_dir)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    engine_cfg = cfg.engines["vllm"].model_copy(
        update={"extra_args": [*cfg.engines["vllm"].extra_args, "--no-enable-prefix-caching"]})
    spec = ServerSpec(engine=engine_cfg, hardware=cfg.hardware, model_dir=Path(a.model_dir),
                      served_name="bench", log_path=out.with_suffix(".server.log"))
    runs: dict[str, list[dict]] = {"bakeoff": [], "vllm_bench": []}
    with get_engine("vllm")(spec) as engine:
        print(f"vLLM ready after {engine.ready():.0f}s at {engine.base_url}", file=sys.stderr)
        warm = make_prompts(tok, a.prompt_len, a.concurrency, seed=999, tag="warm")
        asyncio.run(run_bakeoff(engine.base_url, "bench", warm, a.prompt_len, 16, a.concurrency))
        for r in range(a.rounds):
            order = ["bakeoff", "vllm_bench"] if r % 2 == 0 else ["vllm_bench", "bakeoff"]
            prompts = make_prompts(tok, a.prompt_len, a.num_requests, seed=r, tag=f"round{r}-")  # the same for both
            for who in order:
                before = server_histograms(engine.base_url)
                if who == "bakeoff":
                    res = asyncio.run(run_bakeoff(engine.base_url, "bench", prompts, a.prompt_len, a.output_len,
                                                  a.concurrency))
                else:
                    res = asyncio.run(run_vllm_bench(engine.base_url, "bench", tok, prompts, a.prompt_len,
                                                     a.output_len, a.concurrency))
                res.update(referee(before, server_histograms(engine.base_url)))
                res["cpu_s_per_1k_tokens"] = 1000 * res["cpu_s"] / res["tokens"]
                runs[who].append(res)
                print(f"round {r} {who:10s} " + json.dumps({k: round(v, 3) for k, v in res.items() if v is not None}),
                      file=sys.stderr)

    keys = ["output_throughput", "median_ttft_ms", "median_tpot_ms", "cpu_s_per_1k_tokens", *REFEREE]
    report: dict = {}
    for k in keys:
        pairs = [(b[k], v[k]) for b, v in zip(runs["bakeoff"], runs["vllm_bench"], strict=True)
                 if b.get(k) and v.get(k)]
        ratios = [b / v for b, v in pairs]
        report[k] = {"bakeoff": statistics.median(b for b, _ in pairs), "vllm_bench": statistics.median(v for _, v in pairs),
                     "ratio": statistics.median(ratios), "ratio_range": [min(ratios), max(ratios)],
                     "rounds": len(ratios)}
    targets = {"output_throughput": (0.97, 1.03), "median_ttft_ms": (0.95, 1.05), "median_tpot_ms": (0.95, 1.05),
               "cpu_s_per_1k_tokens": (0.0, 0.5)}
    for k, (lo, hi) in targets.items():
        report[k]["target"] = [lo, hi]
        report[k]["met"] = bool(lo <= report[k]["ratio"] <= hi)
    report["settings"] = vars(a)
    report["runs"] = runs
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"{'metric (median of round ratios)':32s} {'bakeoff':>10s} {'vllm bench':>11s} {'ratio':>7s} {'range':>13s}  target")
    for k in keys:
        r = report[k]
        verdict = "" if k not in targets else f"{r['target']} {'met' if r['met'] else 'NOT met'}"
        print(f"{k:32s} {r['bakeoff']:10.3f} {r['vllm_bench']:11.3f} {r['ratio']:7.3f} "
              f"{r['ratio_range'][0]:6.3f}-{r['ratio_range'][1]:5.3f}  {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
