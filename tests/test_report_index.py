"""results/report/index.html: the answer section, as a browser renders it, against the summary's own numbers.

The page is opened in headless Chromium (Debian's, installed by `make test`); its leader rows are read from
the rendered DOM and checked against leaders computed here, independently, from results/summary.csv.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import tempfile
from collections import defaultdict
from html.parser import HTMLParser
from pathlib import Path

import pytest

from bakeoff.report.answer import fixed_leaders, frontier, slo_leaders
from bakeoff.report.index import index_html

from conftest import Pipeline

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--virtual-time-budget=5000"]


def render(page: Path) -> str:
    """The page's DOM after its scripts ran, as Chromium dumps it (offline: a file:// address)."""
    assert Path(CHROMIUM).exists(), f"{CHROMIUM} is missing: `make test` installs Debian's chromium"
    with tempfile.TemporaryDirectory() as profile:
        proc = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "--dump-dom", page.resolve().as_uri()],
                              capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "<body" in proc.stdout, proc.stderr[-2000:]
    return proc.stdout


class _Leads(HTMLParser):
    """Every ``tr.lead`` of the answer section, by its data attributes."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[dict[str, str]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "tr" and a.get("class") == "lead":
            self.rows.append({k.removeprefix("data-"): v for k, v in a.items() if k.startswith("data-")})


def _leads(dom: str) -> list[dict[str, str]]:
    p = _Leads()
    p.feed(dom)
    return p.rows


def _summary_leaders(rows: list[dict[str, str]]) -> dict[tuple[str, str, str], tuple[str, float]]:
    """The test's own arithmetic: the highest mean output tok/s over ok fixed repeats, per cell."""
    cells: dict[tuple[str, str, str], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        if r["status"] == "ok" and not r.get("probe_of") and r["output_throughput"]:
            cells[(r["experiment"], r["prompt_len"], f"c={r['concurrency']}")][f"{r['engine']}-{r['format']}"].append(
                float(r["output_throughput"]))
    out = {}
    for key, by_variant in cells.items():
        value, leader = max((statistics.fmean(v), name) for name, v in by_variant.items())
        out[key] = (leader, value)
    return out


@pytest.mark.slow
def test_the_rendered_answer_names_the_summarys_leaders(pipeline: Pipeline) -> None:
    page = pipeline.results / "report" / "index.html"
    rows = pipeline.rows()
    dom = render(page)
    shown = {(r["experiment"], r["prompt"], r["load"]): (r["leader"], float(r["value"]))
             for r in _leads(dom) if r["load"].startswith("c=")}
    expected = _summary_leaders(rows)
    assert shown.keys() == expected.keys()
    for key, (leader, value) in expected.items():
        assert shown[key][0] == leader and shown[key][1] == pytest.approx(value, rel=1e-12), key
    slo_rows = [r for r in _leads(dom) if not r["load"].startswith("c=")]
    assert {r["load"] for r in slo_rows} == {"server", "interactive", "cpu"}  # no search in ci: the fixed cells' answer
    # self-contained: nothing fetched, every image inline, and the full table has every row
    assert "http://" not in dom.replace("http://www.w3.org", "") and "https://" not in dom
    assert dom.count("<img") >= 2 and all("data:image/png;base64," in chunk.split(">")[0]
                                          for chunk in dom.split("<img")[1:])
    table = dom[dom.index("id=\"table\""):]
    assert table.count("<tr") == len(rows) + 1


def _row(variant: str, c: int, tok_s: float, block: int, kl: str = "") -> dict[str, str]:
    engine, fmt = variant.split("-")
    return {"experiment": "e", "model": "m", "engine": engine, "format": fmt, "hardware": "h", "node_id": "n",
            "concurrency": str(c), "prompt_len": "128", "output_len": "32", "request_rate": "", "status": "ok",
            "output_throughput": str(tok_s), "block": str(block), "p99_ttft_ms": "100", "p99_tpot_ms": "20",
            "kl_vs_fp16": kl, "joules_per_output_token": ""}


def test_leaders_say_different_or_no_verdict_with_the_interval_and_each_blocks_direction() -> None:
    clear = [_row("llamacpp-q4", 8, v, b) for b, v in enumerate((110.0, 111.0, 109.0))]
    clear += [_row("llamacpp-f16", 8, v, b) for b, v in enumerate((100.0, 101.0, 99.5))]
    noisy = [_row("llamacpp-q4", 1, v, b) for b, v in enumerate((50.0, 58.0, 45.0))]
    noisy += [_row("llamacpp-f16", 1, v, b) for b, v in enumerate((49.0, 52.0, 50.0))]
    single = [_row("llamacpp-q4", 32, 300.0, 0), _row("llamacpp-f16", 32, 290.0, 0)]
    leads = {x.load: x for x in fixed_leaders(clear + noisy + single)}
    assert leads["c=8"].leader == "llamacpp-q4" and leads["c=8"].kind == "different"
    assert leads["c=8"].verdict.startswith("different: +9.8% (95% interval")
    assert leads["c=8"].verdict.endswith("llamacpp-q4 faster in 3 of 3 blocks")
    assert leads["c=8"].margin_pct == pytest.approx(100 * (110 / 100.1666 - 1), rel=1e-3)
    # +4 % a block's noise of +-10 %: nothing shown either way, and the answer says what would settle it
    assert leads["c=1"].leader == "llamacpp-q4" and leads["c=1"].kind == "no verdict"
    assert "95% interval" in leads["c=1"].verdict and "blocks would settle a difference of 3%" in leads["c=1"].verdict
    assert "llamacpp-q4 faster in 2 of 3 blocks, llamacpp-f16 in 1" in leads["c=1"].verdict
    assert leads["c=32"].verdict == "no verdict: fewer than 2 ok repeats a side"


def test_the_frontier_marks_only_undominated_variants_and_the_page_is_self_contained(tmp_path: Path) -> None:
    rows = [_row("llamacpp-f16", 32, 100.0, 0, kl="0"), _row("llamacpp-q8", 32, 120.0, 0, kl="0.01"),
            _row("llamacpp-q4", 32, 150.0, 0, kl="0.05"), _row("llamacpp-q2", 32, 140.0, 0, kl="0.2")]
    pareto = {p.variant: p.pareto for p in frontier(rows, [])}
    assert pareto == {"llamacpp-f16": True, "llamacpp-q8": True, "llamacpp-q4": True, "llamacpp-q2": False}
    summary = tmp_path / "summary.csv"
    summary.write_text(",".join(rows[0]) + "\n" + "".join(",".join(r.values()) + "\n" for r in rows))
    out = tmp_path / "index.html"
    index_html(summary, None, [], out)
    page = out.read_text()
    assert page.index("id='answer'") < page.index("id='frontier'") < page.index("id='capacity'") < page.index("id='table'")
    assert "<script src" not in page and "<link" not in page and "data:image/png;base64," in page


def _cap(variant: str, slo: str, c: int, converged: bool = True, tput: str = "", node: str = "n") -> dict[str, str]:
    engine, fmt = variant.split("-")
    return {"experiment": "e", "node_id": node, "engine": engine, "format": fmt, "prompt_len": "128", "slo": slo,
            "capacity_concurrency": str(c), "concurrency_converged": str(converged), "concurrency_at_limit": "False",
            "capacity_rate": "", "output_throughput_at_capacity": tput}


def test_slo_leaders_rank_by_capacity_and_give_no_verdict_on_an_open_search() -> None:
    leads = {x.load: x for x in slo_leaders([], [_cap("llamacpp-q4", "server", 12), _cap("llamacpp-f16", "server", 8),
                                                   _cap("llamacpp-q4", "interactive", 5),
                                                   _cap("llamacpp-f16", "interactive", 4),
                                                   _cap("llamacpp-q4", "cpu", 16, converged=False),
                                                   _cap("llamacpp-f16", "cpu", 9)])}
    assert (leads["server"].leader, leads["server"].value, leads["server"].runner_up) == ("llamacpp-q4", 12, "llamacpp-f16")
    assert leads["server"].verdict.startswith("different: llamacpp-q4 passed 12 users")
    assert leads["interactive"].verdict.startswith("within the searches' resolution")
    cpu = leads["cpu"].verdict
    assert cpu.startswith("no verdict: a search stopped at a limit") and "llamacpp-q4: its probe budget" in cpu
    # a variant with capacity 0 sits on the frontier at 0 tok/s, not at some other cell's throughput
    rows = [_row("llamacpp-q4", 1, 76.0, 0, kl="0.04"), _row("llamacpp-f16", 1, 100.0, 0, kl="0")]
    pts = {p.variant: p for p in frontier(rows, [_cap("llamacpp-q4", "cpu", 0), _cap("llamacpp-f16", "cpu", 4, tput="230")])}
    assert pts["llamacpp-q4"].throughput == 0.0 and pts["llamacpp-f16"].throughput == 230.0
    assert pts["llamacpp-f16"].pareto and not pts["llamacpp-q4"].pareto


def test_two_nodes_get_two_answers_and_no_number_is_a_mean_across_them(tmp_path: Path) -> None:
    """Node a: q4 leads by 10 %; node b (a slower card): f16 leads. A pooled answer would mix 4 rows into 2 means."""
    rows = []
    for node, q4, f16 in (("a", (110.0, 111.0), (100.0, 101.0)), ("b", (60.0, 61.0), (70.0, 71.0))):
        for b in range(2):
            rows += [{**_row("llamacpp-q4", 8, q4[b], b), "node_id": node},
                     {**_row("llamacpp-f16", 8, f16[b], b), "node_id": node}]
    leads = {x.node: x for x in fixed_leaders(rows)}
    assert set(leads) == {"a", "b"}
    assert (leads["a"].leader, leads["a"].value, leads["a"].runner_value) == ("llamacpp-q4", 110.5, 100.5)
    assert (leads["b"].leader, leads["b"].value, leads["b"].runner_value) == ("llamacpp-f16", 70.5, 60.5)
    assert all(not x.verdict.startswith("no verdict: measured on different nodes") for x in leads.values())
    caps = [_cap("llamacpp-q4", "server", 12, tput="500", node="a"), _cap("llamacpp-f16", "server", 8, tput="400", node="a"),
            _cap("llamacpp-q4", "server", 4, tput="90", node="b"), _cap("llamacpp-f16", "server", 6, tput="95", node="b")]
    slo = {x.node: x for x in slo_leaders(rows, caps)}
    assert (slo["a"].leader, slo["a"].value) == ("llamacpp-q4", 12) and (slo["b"].leader, slo["b"].value) == ("llamacpp-f16", 6)
    pts = {(p.node, p.variant): p.throughput for p in frontier(rows, caps)}
    assert pts == {("a", "llamacpp-q4"): 500.0, ("a", "llamacpp-f16"): 400.0,
                   ("b", "llamacpp-q4"): 90.0, ("b", "llamacpp-f16"): 95.0}
    summary, cap_csv, out = tmp_path / "summary.csv", tmp_path / "capacity.csv", tmp_path / "index.html"
    summary.write_text(",".join(rows[0]) + "\n" + "".join(",".join(r.values()) + "\n" for r in rows))
    cap_csv.write_text(",".join(caps[0]) + "\n" + "".join(",".join(r.values()) + "\n" for r in caps))
    index_html(summary, cap_csv, [], out)
    page = out.read_text()
    assert page.count("class='answer-head' data-node='a'") == 1 and page.count("class='answer-head' data-node='b'") == 1
    pooled = f"{(110.5 + 60.5) / 2!r}"  # q4's mean over both nodes must appear nowhere
    assert f"data-value='{pooled}'" not in page and "data-value='110.5'" in page and "data-value='70.5'" in page
    # the capacity table lists node a's rows, then node b's, with the node beside each
    cap_table = page[page.index("id='capacity'"):page.index("id='published'")]
    assert cap_table.index("<th>node_id</th>") < cap_table.index("<th>prompt_len</th>")
    assert cap_table.index("<td>500</td>") < cap_table.index("<td>90</td>")


def test_an_unconverged_search_is_at_least_on_the_page_and_the_frontier() -> None:
    caps = [_cap("llamacpp-q4", "server", 32, converged=False, tput="700"), _cap("llamacpp-f16", "server", 8, tput="300")]
    pts = {p.variant: p for p in frontier([], caps)}
    assert pts["llamacpp-q4"].throughput_at.startswith("at least: c=32")
    assert pts["llamacpp-f16"].throughput_at == "capacity under server"
    lead = slo_leaders([], caps)[0]
    assert lead.at_least == (True, False) and lead.verdict.startswith("no verdict")


def test_two_searches_differ_only_where_their_brackets_do_and_only_under_one_start() -> None:
    """At a 5 % resolution a search ends at a bracket: the leader's pass must reach the runner-up's fail (and be
    more than one user above its pass) to be called different; overlapping brackets, or capacities made by
    different starts (a burst against a ramp), give no verdict."""
    def row(variant: str, c: int, fail: int, start: str = "ramp") -> dict[str, str]:
        return {**_cap(variant, "interactive", c), "concurrency_fail": str(fail), "capacity_start": start,
                "concurrency_bracket": f"{c}–{fail}"}

    apart = slo_leaders([], [row("vllm-fp8", 320, 336), row("vllm-fp16", 256, 268)])[0]
    assert apart.verdict == "different: vllm-fp8 passed 320 users, where vllm-fp16 failed at 268"
    overlap = slo_leaders([], [row("vllm-fp8", 320, 336), row("vllm-fp16", 310, 325)])[0]
    assert overlap.verdict.startswith("within the searches' resolution: the brackets overlap")
    assert "vllm-fp8 320–336" in overlap.verdict and "vllm-fp16 310–325" in overlap.verdict
    starts = slo_leaders([], [row("vllm-fp8", 320, 336), row("vllm-fp16", 192, 193, start="burst")])[0]
    assert starts.verdict.startswith("no verdict: capacities made by different starts")


def test_the_answer_gives_each_capacity_as_its_bracket_rule_and_start(tmp_path: Path) -> None:
    row = {**_cap("vllm-fp8", "interactive", 192), "concurrency_fail": "200", "concurrency_bracket": "192–200",
           "capacity_start": "ramp", "capacity_verdict_rule": "confident"}
    lead = slo_leaders([], [row])[0]
    assert lead.brackets == ("192–200 users, confident, ramped", "")
    old = slo_leaders([], [_cap("vllm-fp8", "interactive", 192)])[0]  # a row from before brackets and starts
    assert old.brackets == ("192 users, point, burst start", "")


def test_a_load_run_both_ways_shows_the_bursts_ttft_beside_the_steady_one() -> None:
    from bakeoff.report.index import start_pairs

    base = {"experiment": "e", "node_id": "n", "engine": "vllm", "format": "fp8", "prompt_len": "128",
            "concurrency": "192", "status": "ok"}
    burst = {**base, "cell": "cap-interactive-c192-p128", "p99_ttft_ms": "491"}  # before rows named their start
    ramp = {**base, "cell": "cap-interactive-c192-p128-r", "load_start": "ramp", "p99_ttft_ms": "88",
            "p99_ttft_ms_whole_cell": "130", "load_ramp_s": "6.4"}
    other = {**base, "concurrency": "224", "load_start": "ramp", "p99_ttft_ms": "95"}  # no burst at 224
    pairs = start_pairs([burst, ramp, other])
    assert [(p["concurrency"], p["burst_p99_ttft_ms"], p["ramp_p99_ttft_ms"]) for p in pairs] == [("192", "491", "88")]
