"""What the plots draw, read back from the figure: the right cells, their medians and their spread."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from bakeoff.report.plots import throughput_figure


def _row(engine: str, fmt: str, c: int, p: int, tok_s: float, status: str = "ok") -> dict[str, str]:
    return {"experiment": "e", "engine": engine, "format": fmt, "concurrency": str(c), "prompt_len": str(p),
            "status": status, "output_throughput": str(tok_s)}


def test_throughput_is_the_median_of_repeats_with_their_range_and_skips_failed_cells() -> None:
    rows = [_row("llamacpp", "q4_k_m", 1, 128, y) for y in (10.0, 12.0, 11.5)]
    rows += [_row("llamacpp", "q4_k_m", 8, 128, 50.0), _row("llamacpp", "q4_k_m", 8, 128, 999.0, status="failed")]
    rows += [_row("vllm", "fp16", 1, 128, 20.0), _row("vllm", "fp16", 1, 1024, 7.0)]
    fig = throughput_figure(rows)
    try:
        p128, p1024 = fig.axes
        assert p128.get_title() == "prompt 128 tokens" and p1024.get_title() == "prompt 1024 tokens"
        drawn = {c.get_label(): c for c in p128.containers}
        assert sorted(drawn) == ["llamacpp-q4_k_m", "vllm-fp16"]
        q4 = drawn["llamacpp-q4_k_m"]
        assert q4.lines[0].get_xydata().tolist() == [[1.0, 11.5], [8.0, 50.0]]  # the median, not the last repeat
        bars = [np.asarray(seg)[:, 1].tolist() for seg in q4.lines[2][0].get_segments()]  # each bar's (low, high)
        assert bars == [[10.0, 12.0], [50.0, 50.0]]  # the repeats' range; one repeat, no length
        assert {c.get_label() for c in p1024.containers} == {"vllm-fp16"}
    finally:
        plt.close(fig)
