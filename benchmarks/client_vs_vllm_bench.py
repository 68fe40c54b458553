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

Where the server runs here, each run also records where the processes ran (bakeoff.loadgen.core_watch): the
CPU share of each server process (vLLM's API server streams every token) and how often a client thread shared a
busy server thread's physical core, which would slow the server's delivery without moving its histograms.

Client CPU is the benchmarking process's own user+sys time (getrusage: itself and its finished children, so
bakeoff's worker processes count) around each client's measured run; the clients run one at a time.

Clients are named ``bakeoff:W`` (bakeoff's client with W workers), ``bakeoff:auto`` (as many as
``load.client.workers: auto`` picks) and ``vllm_bench``; each round runs every
client once, the order rotating from round to round. The server is vLLM started here (the default, the
embedded model on this CPU), an existing server (``--url``, e.g. vLLM on a GPU node), or the echo server
(``--echo-token-delay-ms``: a stand-in that costs nothing, so only the clients' own CPU differs).

    .venv/bin/python benchmarks/client_vs_vllm_bench.py --rounds 10
    .venv/bin/python benchmarks/client_vs_vllm_bench.py --echo-token-delay-ms 5 --concurrency 32 --rounds 6
    python3 benchmarks/client_vs_vllm_bench.py --model-dir models/llama2-7b-synthetic/fp8-online \
        --config experiment=h100_capacity hardware=auto --prompt-len 128 --output-len 256 \
        --concurrency 64 128 256 512 --clients bakeoff:1 bakeoff:4 vllm_bench --rounds 1

A check stopped by a call's time limit continues in a later call: ``--resume <its report>`` keeps every round that
finished (all clients ran, so a round's pairs always share one server start), runs the rest, and feeds
``bakeoff:auto``'s sizer the kept runs first, as if it had seen them. Each run says which call made it (``call``).

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
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bakeoff.loadgen.core_watch import CoreWatch

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
    """The server-side means over one run, in ms (bakeoff.loadgen.server_latency: the window's sums over counts)."""
    from bakeoff.loadgen.server_latency import window_means

    return window_means(before, after, REFEREE)


def cpu_s() -> float:
    """This process's CPU seconds, and those of its children that have ended (bakeoff's joined workers)."""
    return sum(ru.ru_utime + ru.ru_stime for ru in (resource.getrusage(resource.RUSAGE_SELF),
                                                     resource.getrusage(resource.RUSAGE_CHILDREN)))


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
            "median_tpot_ms": r["median_tpot_ms"], "p99_tpot_ms": r.get("p99_tpot_ms"),
            "p99_ttft_ms": r.get("p99_ttft_ms"), "cpu_s": cpu, "tokens": r["total_output_tokens"],
            "completed": r["completed"]}


async def run_bakeoff(base_url: str, model: str, prompts: list[str], prompt_len: int, output_len: int,
                      concurrency: int, workers: int = 1) -> dict:
    from bakeoff.loadgen.cellload import CellLoad
    from bakeoff.loadgen.metrics import summarize
    from bakeoff.loadgen.runner import run_cell_async

    c0 = cpu_s()
    load = CellLoad(prompts, prompt_len=prompt_len, output_len=output_len, concurrency=concurrency)
    res = await run_cell_async(base_url, model, load, show_progress=False, workers=workers)
    cpu = cpu_s() - c0
    m = summarize(res.records, res.duration_s)
    return {"output_throughput": m["output_throughput"], "median_ttft_ms": m["median_ttft_ms"],
            "median_tpot_ms": m["median_tpot_ms"], "p99_tpot_ms": m["p99_tpot_ms"], "p99_ttft_ms": m["p99_ttft_ms"],
            "cpu_s": cpu, "tokens": m["total_output_tokens"], "completed": m["completed"],
            **{k: res.client[k] for k in ("client_workers", "client_cpu_share", "client_cpu_s_per_1k_tokens",
                                          "client_loop_lag_p99_ms",
                                          "client_schedule_delay_p99_ms", "client_slot_time_lost_share",
                                          "client_saturated",
                                          "client_saturated_reason")}}


@contextmanager
def server(a: argparse.Namespace, tok) -> Iterator[tuple[str, int | None]]:
    """The base URL of the server the clients share, and its process where it runs here (None for ``--url``):
    given, the echo server, or vLLM started here."""
    if a.url:
        yield a.url.rstrip("/"), None
        return
    if a.echo_token_delay_ms is not None:
        from bakeoff.loadgen.echo_server import own_process

        with own_process(a.echo_token_delay_ms) as (url, pid):
            yield url, pid
        return
    from bakeoff.composition.compose import load_config
    from bakeoff.engines import ServerSpec, get_engine

    cfg = load_config(a.config)  # e.g. experiment=h100_capacity hardware=auto on a GPU node: its vLLM settings
    engine_cfg = cfg.engines["vllm"].model_copy(
        update={"extra_args": [*cfg.engines["vllm"].extra_args, "--no-enable-prefix-caching"]})
    spec = ServerSpec(engine=engine_cfg, hardware=cfg.hardware, model_dir=Path(a.model_dir),
                      served_name=a.served_name, log_path=Path(a.out).with_suffix(".server.log"))
    with get_engine("vllm")(spec) as engine:
        print(f"vLLM ready after {engine.ready():.0f}s at {engine.base_url}", file=sys.stderr)
        yield engine.base_url, engine.pid()


@contextmanager
def watching(pid: int | None) -> Iterator[CoreWatch | None]:
    """The cores of the server's processes and the client's, watched over one run (bakeoff.loadgen.core_watch);
    nothing where the server does not run here."""
    if pid is None:
        yield None
        return
    with CoreWatch(pid) as watch:
        yield watch


RESUME_SETTINGS = ("prompt_len", "output_len", "num_requests", "requests_per_concurrency", "served_name")


def resumed(report: dict, a: argparse.Namespace) -> tuple[dict[str, list[dict]], int]:
    """An earlier call's report cut to its finished rounds (every client of ``a.clients`` ran that concurrency and
    round), and this call's number. A report made with other load settings or other clients is refused: its rounds
    would not pair with this call's."""
    old = report.get("settings", {})
    differ = [k for k in RESUME_SETTINGS if k in old and old[k] != getattr(a, k)]
    if sorted(old.get("clients", a.clients)) != sorted(a.clients):
        differ.append("clients")
    if differ:
        raise SystemExit(f"--resume: the report was made with other {', '.join(differ)} "
                         f"({', '.join(f'{k}={old.get(k)!r}' for k in differ)}): start a new check instead")
    runs = report.get("runs", {})
    done = set.intersection(*({(r["concurrency"], int(r["round"])) for r in runs.get(who, [])} for who in a.clients))
    kept = {who: [r for r in rs if (r["concurrency"], int(r["round"])) in done] for who, rs in runs.items()
            if who in a.clients}
    call = 1 + max((int(r.get("call", 0)) for rs in kept.values() for r in rs), default=-1)
    return {who: rs for who, rs in kept.items() if rs}, call


def feed_sizer(runs: dict[str, list[dict]]) -> None:
    """``bakeoff:auto``'s sizer, shown the kept bakeoff runs in the order they ran (call, concurrency as run, round,
    position), as the call that made them had shown it."""
    global SIZER
    from bakeoff.loadgen.sizing import ClientSizer

    SIZER = SIZER or ClientSizer()
    order = sorted(((int(r.get("call", 0)), int(r.get("order", 0)), int(r["round"]), int(r["position"])), r)
                   for who, rs in runs.items() if who != "vllm_bench" for r in rs)
    for _, r in order:
        observe(r)


def observe(run: dict) -> None:
    """Show ``bakeoff:auto``'s sizer one bakeoff run: the workers' own cost over the measured window (bakeoff.loadgen
    .health), not this process's, which counts each worker process's start; a fixed count is no evidence of need."""
    SIZER.observe(run["concurrency"], run["output_throughput"], run["client_cpu_s_per_1k_tokens"],
                  workers=run["client_workers"], saturated=bool(run["client_saturated"]))


SIZER = None  # bakeoff:auto's sizer: the cells measured on this server so far, as a serving job keeps them


def run_client(who: str, url: str, a: argparse.Namespace, tok, prompts: list[str], c: int) -> dict:
    """One client's run; ``bakeoff:W`` with W workers, ``bakeoff:auto`` with what the pipeline's sizer picks
    (bakeoff.loadgen.sizing, fed every bakeoff run on this server as a serving job feeds it its cells)."""
    global SIZER
    from bakeoff.loadgen.sizing import ClientSizer
    from bakeoff.loadgen.workers import available_cores

    if who == "vllm_bench":
        return asyncio.run(run_vllm_bench(url, a.served_name, tok, prompts, a.prompt_len, a.output_len, c))
    SIZER = SIZER or ClientSizer()
    kind = who.split(":", 1)[1] if ":" in who else "1"
    workers = SIZER.workers(c, available_cores()) if kind == "auto" else int(kind)
    res = asyncio.run(run_bakeoff(url, a.served_name, prompts, a.prompt_len, a.output_len, c, workers))
    observe({**res, "concurrency": c})
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-dir", default=str(ROOT / "models" / "smollm2-135m" / "fp16"),
                    help="the tokenizer (and, when vLLM is started here, the model)")
    ap.add_argument("--url", help="an existing server to drive (not started here)")
    ap.add_argument("--echo-token-delay-ms", type=float, help="drive the echo server at this time a token")
    ap.add_argument("--served-name", default="bench")
    ap.add_argument("--config", nargs="*", default=[],
                    help="Hydra overrides for the vLLM started here (default: the default experiment's)")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[8])
    ap.add_argument("--clients", nargs="+", default=["bakeoff:1", "vllm_bench"])
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--num-requests", type=int, default=48, help="at least; and requests-per-concurrency x c")
    ap.add_argument("--requests-per-concurrency", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "out" / "client_vs_vllm_bench.json"))
    ap.add_argument("--resume", type=Path, help="an earlier call's report: keep its finished rounds, run the rest")
    a = ap.parse_args()

    from transformers import AutoTokenizer

    from bakeoff.loadgen.prompts import make_prompts

    tok = AutoTokenizer.from_pretrained(a.model_dir)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    runs: dict[str, list[dict]] = {}
    call = 0
    if a.resume is not None:
        if not a.resume.is_file():
            raise SystemExit(f"--resume: {a.resume} is not a file")
        runs, call = resumed(json.loads(a.resume.read_text()), a)
        feed_sizer(runs)
        print(f"resuming from {a.resume}: {sum(map(len, runs.values()))} runs of finished rounds kept; "
              f"this is call {call}", file=sys.stderr)
    done = {(r["concurrency"], int(r["round"])) for rs in runs.values() for r in rs}
    with server(a, tok) as (url, pid):
        referee_ok = True
        try:
            server_histograms(url)
        except Exception:  # noqa: BLE001 - a server without vLLM's /metrics: no referee columns
            referee_ok = False
        warm = make_prompts(tok, a.prompt_len, max(a.concurrency), seed=999, tag="warm")
        asyncio.run(run_bakeoff(url, a.served_name, warm, a.prompt_len, 16, max(a.concurrency)))
        for c in a.concurrency:
            n = max(a.num_requests, a.requests_per_concurrency * c)
            for r in range(a.rounds):
                if (c, r) in done:
                    continue
                k = (r + a.concurrency.index(c)) % len(a.clients)
                order = a.clients[k:] + a.clients[:k]
                for who in order:
                    prompts = make_prompts(tok, a.prompt_len, n, seed=1000 * c + r, tag=f"c{c}-round{r}-{who}-")
                    before = server_histograms(url) if referee_ok else {}
                    with watching(pid) as watch:
                        res = run_client(who, url, a, tok, prompts, c)
                    if watch is not None:
                        res.update({**watch.summary(), **watch.columns()})
                    if referee_ok:
                        res.update(referee(before, server_histograms(url)))
                    res["cpu_s_per_1k_tokens"] = 1000 * res["cpu_s"] / res["tokens"] if res["tokens"] else None
                    res.update(concurrency=c, round=r, position=order.index(who), call=call,
                               order=a.concurrency.index(c))
                    runs.setdefault(who, []).append(res)
                    print(f"c={c} round {r} {who:10s} " + json.dumps(
                        {k: (round(v, 3) if isinstance(v, float) else v) for k, v in res.items() if v is not None}),
                        file=sys.stderr, flush=True)
                write_report(out, runs, a)  # after each round: a run stopped at its time limit keeps what finished
    print(table(runs, a.clients))
    return 0


def write_report(out: Path, runs: dict[str, list[dict]], a: argparse.Namespace) -> None:
    """The comparison so far, written whole (temporary file, then rename)."""
    report = compare(runs, a.clients)
    report["settings"] = {k: str(v) if isinstance(v, Path) else v for k, v in vars(a).items()}
    report["runs"] = runs
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(report, indent=2) + "\n")
    tmp.replace(out)


KEYS = ["output_throughput", "median_ttft_ms", "median_tpot_ms", "p99_tpot_ms", "cpu_s_per_1k_tokens", *REFEREE]
TARGETS = {"output_throughput": (0.97, 1.03), "median_ttft_ms": (0.95, 1.05), "median_tpot_ms": (0.95, 1.05),
           "cpu_s_per_1k_tokens": (0.0, 0.5)}


def compare(runs: dict[str, list[dict]], clients: list[str]) -> dict:
    """Per bakeoff client against vllm bench, per metric: the median of the paired round ratios, and the targets."""
    report: dict = {}
    if "vllm_bench" not in runs:
        return report
    for who in (c for c in clients if c != "vllm_bench"):
        rep: dict = {}
        ref = {(v["concurrency"], int(v["round"])): v for v in runs["vllm_bench"]}
        for k in KEYS:
            pairs = [(b[k], v[k]) for b in runs.get(who, []) if (v := ref.get((b["concurrency"], int(b["round"]))))
                     and b.get(k) and v.get(k)]
            if not pairs:
                continue
            ratios = [b / v for b, v in pairs]
            rep[k] = {who: statistics.median(b for b, _ in pairs), "vllm_bench": statistics.median(v for _, v in pairs),
                      "ratio": statistics.median(ratios), "ratio_range": [min(ratios), max(ratios)],
                      "rounds": len(ratios)}
            if k in TARGETS:
                lo, hi = TARGETS[k]
                rep[k].update(target=[lo, hi], met=bool(lo <= rep[k]["ratio"] <= hi))
        report[who] = rep
    return report


def table(runs: dict[str, list[dict]], clients: list[str]) -> str:
    """One markdown row per concurrency and client: medians over rounds."""
    head = ("| c | client | output tok/s | median TTFT ms | median TPOT ms | p99 TPOT ms | CPU-s / 1k tok | "
            "worst worker CPU share | lag p99 ms | schedule delay p99 ms | saturated |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for c in sorted({r["concurrency"] for rs in runs.values() for r in rs}):
        for who in clients:
            rs = [r for r in runs.get(who, []) if r["concurrency"] == c]
            if not rs:
                continue

            def med(k: str, rs: list[dict] = rs) -> str:
                vals = [r[k] for r in rs if isinstance(r.get(k), (int, float)) and not isinstance(r.get(k), bool)]
                return f"{statistics.median(vals):.4g}" if vals else ""

            sat = "" if who == "vllm_bench" else f"{sum(bool(r.get('client_saturated')) for r in rs)}/{len(rs)}"
            lines.append(f"| {c} | {who} | {med('output_throughput')} | {med('median_ttft_ms')} | "
                         f"{med('median_tpot_ms')} | {med('p99_tpot_ms')} | {med('cpu_s_per_1k_tokens')} | "
                         f"{med('client_cpu_share')} | {med('client_loop_lag_p99_ms')} | "
                         f"{med('client_schedule_delay_p99_ms')} | {sat} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
