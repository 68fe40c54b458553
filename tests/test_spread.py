"""Spread across repeats and the noise-floor comparison, on small synthetic summary rows (values written here)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from bakeoff.config.schema import LoadCfg
from bakeoff.loadgen.cells import cells_of
from bakeoff.report.pages import summary_html
from bakeoff.results import spread
from bakeoff.stages.summary import write_csv


def _rows(variant_values: dict[tuple[str, str, float], list[float]], metric: str = "output_throughput") -> list[dict]:
    rows = []
    for (engine, fmt, bits), values in variant_values.items():
        for i, v in enumerate(values):
            rows.append({"experiment": "t", "model": "m", "engine": engine, "format": fmt, "hardware": "cpu",
                         "concurrency": "1", "prompt_len": "32", "output_len": "16", "request_rate": "",
                         "repeat": str(i), "server_start": str(i + 1), "status": "ok", "reason": "",
                         "bits_per_weight": str(bits), metric: f"{v:.6g}"})
    return rows


def test_spread_is_mean_sample_std_cv_and_student_t_interval() -> None:
    s = spread.spread([98.0, 100.0, 102.0])
    assert (s.n, s.mean, s.std, s.cv_pct) == (3, 100.0, 2.0, 2.0)
    assert s.ci95 == pytest.approx(4.302653 * 2.0 / math.sqrt(3), rel=1e-6)  # t(0.975, 2 df) = 4.3027
    one = spread.spread([5.0])
    assert one.mean == 5.0 and math.isnan(one.std) and math.isnan(one.ci95)


def test_welch_marks_a_gap_beyond_the_noise_significant_and_one_within_it_not() -> None:
    clear = spread.compare([10.0, 11.0, 12.0], [20.0, 21.0, 22.0])
    assert clear.significant is True and clear.p < 0.001 and clear.rel_pct == pytest.approx(90.909, rel=1e-4)
    noisy = spread.compare([10.0, 14.0, 6.0], [11.0, 7.0, 15.0])  # +10 % with +-40 % noise
    assert noisy.significant is False and noisy.p > 0.5
    assert spread.compare([10.0], [20.0, 21.0]).significant is None  # one repeat: no verdict, never "significant"


def test_summary_columns_and_report_list_each_difference_under_its_verdict(tmp_path: Path) -> None:
    rows = _rows({("llamacpp", "f16", 16.0): [100.0, 101.0, 99.0],
                  ("llamacpp", "q8_0", 8.5): [130.0, 131.0, 129.5],   # +30 %: beyond a 1 % noise floor
                  ("llamacpp", "q4_k_m", 4.5): [103.0, 95.0, 106.0],  # +1.3 % within its own noise
                  ("vllm", "fp16", 16.0): [60.0, 61.0, 60.5]})
    cols = spread.extend(rows)
    assert set(spread.GROUP_COLUMNS) <= set(cols)
    by = {(r["format"], r["repeat"]): r for r in rows}
    f16 = by[("f16", "0")]
    assert f16["repeats_ok"] == 3 and f16["repeat_server_starts"] == 3
    assert f16["output_throughput_mean"] == "100" and f16["output_throughput_cv_pct"] == "1"
    assert f16["ref_variant"] == ""  # the reference itself
    q8, q4 = by[("q8_0", "2")], by[("q4_k_m", "1")]
    assert q8["ref_variant"] == "llamacpp-f16" and q8["output_throughput_vs_ref_significant"] is True
    assert float(q8["output_throughput_vs_ref_pct"]) == pytest.approx(30.17, abs=0.01)
    assert q8["output_throughput_vs_ref_verdict"] == "different"
    assert q4["output_throughput_vs_ref_significant"] is False
    assert q4["output_throughput_vs_ref_verdict"] == "no verdict" and int(q4["output_throughput_vs_ref_blocks_needed"]) > 3
    assert q4["equivalence_margin_pct"] == "3"
    summary = tmp_path / "summary.csv"
    write_csv(summary, rows, ["experiment", "model", "engine", "format", "hardware", "concurrency", "prompt_len",
                              "output_len", "request_rate", "repeat", "server_start", "status", "reason",
                              "bits_per_weight", "output_throughput", *cols])
    summary_html(summary, tmp_path / "summary.html")
    page = (tmp_path / "summary.html").read_text()
    different, rest = page.split("<h4>Different")[1].split("<h4>Equivalent")
    equivalent, no_verdict = rest.split("<h4>No verdict")
    assert "llamacpp-q8_0 vs llamacpp-f16: output_throughput different: +30.2%" in different
    assert "llamacpp-q4_k_m vs llamacpp-f16: output_throughput no verdict: +1.3%" in no_verdict
    assert "llamacpp-q4_k_m" not in different and "llamacpp-q4_k_m" not in equivalent
    assert "vllm-fp16 vs llamacpp-f16: output_throughput different: -39.5%" in different  # the engines' 16-bit rows


def test_single_repeat_gives_no_verdict_and_says_so(tmp_path: Path) -> None:
    rows = _rows({("llamacpp", "f16", 16.0): [100.0], ("llamacpp", "q8_0", 8.5): [130.0]})
    spread.extend(rows)
    assert rows[1]["output_throughput_vs_ref_significant"] == "" and rows[1]["output_throughput_std"] == ""
    assert "no verdict" in spread.comparisons(rows)[0].diff.verdict


def test_failed_repeats_do_not_enter_the_spread() -> None:
    rows = _rows({("llamacpp", "f16", 16.0): [100.0, 102.0, 0.0]})
    rows[2]["status"] = "failed"
    spread.extend(rows)
    assert rows[0]["repeats_ok"] == 2 and rows[0]["output_throughput_mean"] == "101"


def test_each_repeat_is_a_pass_over_the_matrix() -> None:
    load = LoadCfg(concurrency=[1, 4], prompt_len=[32], output_len=8, num_requests=2, repeats=2)
    assert [(c.repeat, c.concurrency) for c in cells_of(load)] == [(0, 1), (0, 4), (1, 1), (1, 4)]


def test_the_test_is_welchs_not_students() -> None:
    """Unequal spreads and sizes, where the pooled-variance (Student) p and Welch's differ: the p-value must be
    Welch's, computed here from its formula (Welch-Satterthwaite degrees of freedom)."""
    from scipy import stats

    a = [100.0, 100.5, 99.5, 100.2, 99.8, 100.1]  # tight, 6 repeats
    b = [104.0, 96.0, 110.0]  # noisy, 3 repeats
    na, nb = len(a), len(b)
    ma, mb = sum(a) / na, sum(b) / nb
    va = sum((x - ma) ** 2 for x in a) / (na - 1)
    vb = sum((x - mb) ** 2 for x in b) / (nb - 1)
    se2 = va / na + vb / nb
    t = (mb - ma) / math.sqrt(se2)
    df = se2**2 / ((va / na) ** 2 / (na - 1) + (vb / nb) ** 2 / (nb - 1))
    welch_p = 2 * stats.t.sf(abs(t), df)
    pooled = ((na - 1) * va + (nb - 1) * vb) / (na + nb - 2)
    student_p = 2 * stats.t.sf(abs(mb - ma) / math.sqrt(pooled * (1 / na + 1 / nb)), na + nb - 2)
    assert abs(welch_p - student_p) > 0.1  # the data tells the two tests apart
    assert spread.compare(a, b).p == pytest.approx(welch_p, rel=1e-9)
