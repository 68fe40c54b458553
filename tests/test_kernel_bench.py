"""Kernel-only speed beside served speed: llama-bench's command, and the summary's join.

The llama-bench records are hand-written in llama-bench's -o json shape (the fields
bakeoff.results.llamabench reads), with the H200's measured f16 numbers as values.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bakeoff.config.schema import HardwareCfg, LoadCfg
from bakeoff.errors import ToolchainError
from bakeoff.stages.kernel_bench import command, flash_attn_mode, join


def test_flash_attn_mode_maps_server_settings():
    assert [flash_attn_mode(v) for v in ("on", True, 1, "off", False, None, "auto")] == \
        ["on", "on", "on", "off", "off", "auto", "auto"]
    with pytest.raises(ToolchainError):
        flash_attn_mode("sometimes")


def test_command_offloads_like_the_server():
    gpu = HardwareCfg(name="h200", backend="cuda", gpus=1, cuda_arch=90)
    cmd = command(Path("llama-bench"), Path("m.gguf"), gpu, "on")
    assert cmd[cmd.index("-fa") + 1] == "on" and cmd[cmd.index("-ngl") + 1] == "99"
    assert cmd[cmd.index("-p") + 1] == "512" and cmd[cmd.index("-n") + 1] == "128"
    two = HardwareCfg(name="h200x2", backend="cuda", gpus=2, cuda_arch=90, llamacpp_split_mode="row")
    assert "-sm" in command(Path("b"), Path("m"), two, "off")
    cpu = HardwareCfg(name="cpu", backend="cpu", gpus=0)
    assert command(Path("b"), Path("m"), cpu, "auto")[-2:] == ["-ngl", "0"]


def _row(conc: int, prompt: int, tok_s: float, fa: str = "on", experiment: str = "e") -> dict:
    return {"experiment": experiment, "engine": "llamacpp", "model": "m", "format": "f16", "concurrency": str(conc),
            "prompt_len": str(prompt), "repeat": "0", "output_throughput": f"{tok_s:.6g}",
            "engine_settings": json.dumps({"flash_attn": fa})}


def test_join_puts_kernel_and_served_over_kernel_on_each_row(tmp_path: Path):
    k = tmp_path / "f16-faon.json"
    k.write_text(json.dumps({"model": "m", "format": "f16", "flash_attn": "on", "tg_tok_s": 221.77,
                             "pp_tok_s": 22739.3}))
    rows = [_row(1, 128, 184.71), _row(8, 128, 616.9), _row(1, 1024, 170.0), _row(1, 128, 90.0, fa="off", experiment="e.fa=off")]
    cols = join(rows, [k])
    assert cols == ["kernel_tg_tok_s", "kernel_pp_tok_s", "kernel_flash_attn", "served_over_kernel"]
    assert rows[0]["kernel_tg_tok_s"] == 221.77
    assert rows[0]["served_over_kernel"] == pytest.approx(184.71 / 221.77)
    assert rows[1]["served_over_kernel"] == pytest.approx(184.71 / 221.77)  # its variant's c=1 cell, same prompt
    assert rows[2]["served_over_kernel"] == pytest.approx(170.0 / 221.77)
    assert "kernel_tg_tok_s" not in rows[3]  # no llama-bench at flash_attn off


def test_fewer_requests_for_a_format_is_noted():
    load = LoadCfg(concurrency=[1, 32], prompt_len=[128], output_len=256, num_requests=100,
                   num_requests_by_format={"f16": 20})
    f16, note = load.for_variant({}, "f16")
    assert f16.num_requests == 20 and "20 requests" in note and "instead of 100" in note
    q8, note = load.for_variant({}, "q8_0")
    assert q8.num_requests == 100 and note == ""
    pair, _ = load.for_variant({"concurrency": [32], "prompt_len": [128]}, "q4_k_m")
    assert pair.concurrency == [32] and pair.num_requests == 100


def test_the_cold_first_repetition_is_left_out_of_the_kernel_rate() -> None:
    """The samples are llama-bench's own, from the H200 record (runs/h200-llamacpp-blocks-2026-12-04,
    f16 pp512: its first repetition ran cold). Fewer than three samples keep llama-bench's mean."""
    import statistics

    from bakeoff.results.llamabench import parse_records

    rec = {"n_prompt": 512, "n_gen": 0, "flash_attn": 1, "model_size": 13477363712, "model_n_params": 6738415616,
           "avg_ts": 22003.987163, "stddev_ts": 4355.991367, "samples_ts": [14215, 24087.3, 23930.7, 24031.9, 23755]}
    (m,) = parse_records([rec])
    assert m["tok_s"] == pytest.approx(statistics.fmean([24087.3, 23930.7, 24031.9, 23755]))
    assert m["stddev"] == pytest.approx(statistics.stdev([24087.3, 23930.7, 24031.9, 23755]))
    assert m["cold_repetitions_dropped"] == 1 and m["tok_s"] > rec["avg_ts"]
    (short,) = parse_records([{**rec, "samples_ts": [14215, 24087.3]}])
    assert (short["tok_s"], short["stddev"], short["cold_repetitions_dropped"]) == (22003.987163, 4355.991367, 0)
