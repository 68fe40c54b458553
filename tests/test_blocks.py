"""Blocks: the seeded run order, what each row records of it, and comparisons kept within one node.

A block runs every variant once, each on its own server, in an order that is a seeded shuffle rotated by
one place per block (a Latin square). Comparisons pair variants by block on one node; the same cell on
two nodes is reported apart and never compared.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import threading
import time
from collections import Counter
from pathlib import Path

import psutil
import pytest

from bakeoff.composition.compose import load_config
from bakeoff.config.schema import LoadCfg
from bakeoff.engines.session import start_id
from bakeoff.hardware.fingerprint import node_id
from bakeoff.loadgen.blocks import previous, schedule, slot_of
from bakeoff.report.answer import fixed_leaders
from bakeoff.results import spread
from bakeoff.results.derived import _hardware_for_roofline
from bakeoff.results.roofline import row_columns
from bakeoff.serving.job import ServeJob
from bakeoff.stages import serve_load
from bakeoff.stages.summary import COLUMNS, rows

from conftest import cpu_toolchain

V = [("llamacpp", "f16"), ("llamacpp", "q8_0"), ("llamacpp", "q4_k_m")]


def test_every_variant_once_per_block_each_position_once_and_the_seed_decides() -> None:
    slots = schedule(V, 3, seed=0)
    assert [s.block for s in slots] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    for b in range(3):
        assert sorted((s.engine, s.format) for s in slots if s.block == b) == sorted(V)
        assert [s.order for s in slots if s.block == b] == [0, 1, 2]
    # a Latin square: each variant in each position once over three blocks
    assert Counter((s.format, s.order) for s in slots) == Counter({(f, k): 1 for _, f in V for k in range(3)})
    assert schedule(V, 3, seed=0) == slots  # the same seed, the same order
    orders = {tuple((s.engine, s.format) for s in schedule(V, 3, seed) if s.block == 0) for seed in range(20)}
    assert len(orders) > 1  # another seed, another order
    assert schedule(V, 4, seed=0)[:9] == slots  # a block added later leaves the earlier ones as they ran


def test_a_variant_with_fewer_repeats_sits_out_later_blocks_and_the_chain_is_total() -> None:
    slots = schedule([*V, ("llamacpp_cacheram", "q4_k_m")], [3, 3, 3, 1], seed=0)
    assert len(slots) == 10
    assert [s.block for s in slots if s.engine == "llamacpp_cacheram"] == [0]
    assert [s.order for s in slots if s.block == 1] == [0, 1, 2]  # orders count only the block's variants
    first = slots[0]
    assert previous(slots, first) is None
    assert previous(slots, slots[5]) == slots[4]
    assert slot_of(slots, "llamacpp", "q8_0", 2).block == 2
    with pytest.raises(KeyError):
        slot_of(slots, "llamacpp_cacheram", "q4_k_m", 1)
    with pytest.raises(ValueError):
        schedule(V, [3, 3], seed=0)


def test_rows_carry_block_order_and_node(tmp_path: Path) -> None:
    cell = {"engine": "llamacpp", "format": "f16", "concurrency": 8, "prompt_len": 128, "repeat": 2, "block": 2,
            "order": 1, "node_id": "gpu:GPU-a", "status": "ok", "warmup_requests": 8,
            "steady_output_throughput": 790.0, "gpu_sm_clock_start_mhz": 1980}
    idx = tmp_path / "cells.json"
    idx.write_text(json.dumps({"variant": {"experiment": "e", "engine": "llamacpp", "format": "f16"}, "cells": [cell]}))
    (row,) = rows([idx], {})
    assert {k: row[k] for k in ("block", "order", "node_id", "warmup_requests")} == \
        {"block": 2, "order": 1, "node_id": "gpu:GPU-a", "warmup_requests": 8}
    assert {"steady_output_throughput", "tail_share", "gpu_sm_clock_start_mhz"} <= set(COLUMNS)


def _row(fmt: str, block: int, tput: float, node: str = "gpu:GPU-a") -> dict:
    return {"experiment": "e", "model": "m", "engine": "llamacpp", "format": fmt, "hardware": "h200",
            "node_id": node, "concurrency": "32", "prompt_len": "128", "output_len": "256", "request_rate": "",
            "bits_per_weight": {"f16": "16", "q4_k_m": "4.9"}[fmt], "status": "ok", "block": str(block),
            "repeat": str(block), "output_throughput": str(tput), "median_ttft_ms": "100", "median_tpot_ms": "10",
            "median_e2el_ms": "2000"}


def test_blocks_pair_the_comparison_so_drift_between_blocks_cancels() -> None:
    """q4_k_m is 2 % slower than f16 in every block, while the blocks drift by 20 %: Welch on the pooled
    repeats sees noise, the paired test sees the 2 %."""
    drift = [1000.0, 1100.0, 1200.0]
    data = [_row("f16", b, d) for b, d in enumerate(drift)] + [_row("q4_k_m", b, d * 0.98) for b, d in enumerate(drift)]
    (c,) = [c for c in spread.comparisons(data) if c.metric == "output_throughput"]
    assert c.diff.pairing == "blocks" and c.n_a == c.n_b == 3 and c.node == "gpu:GPU-a"
    assert c.diff.rel_pct == pytest.approx(-2.0)
    assert c.diff.significant is True and c.diff.ci95_pct < 1.0
    welch = spread.compare(drift, [d * 0.98 for d in drift])
    assert welch.significant is False
    assert "3 blocks, paired" in c.line()


def test_cells_from_different_nodes_are_never_compared_and_their_spread_is_reported_apart() -> None:
    data = [_row("f16", b, 1000.0 + b, "gpu:GPU-a") for b in range(3)]
    data += [_row("q4_k_m", b, 900.0 + b, "gpu:GPU-b") for b in range(3)]
    assert spread.comparisons(data) == []  # f16 on one node, q4_k_m on another: no comparison at all
    data += [_row("f16", b, 1300.0 + b, "gpu:GPU-b") for b in range(3)]
    found = [c for c in spread.comparisons(data) if c.metric == "output_throughput"]
    assert [c.node for c in found] == ["gpu:GPU-b"]  # only within the node both ran on
    (ns,) = spread.node_spread(data)
    assert ns.variant == "llamacpp-f16" and set(ns.node_means) == {"gpu:GPU-a", "gpu:GPU-b"}
    assert ns.range_pct == pytest.approx(100.0 * 300.0 / 1151.0)
    spread.extend(data)  # each node's cell is its own group: never pooled
    assert {r["repeats_ok"] for r in data if r["format"] == "f16"} == {3}


def test_the_roofline_uses_the_bandwidth_measured_on_the_node_where_the_record_has_one() -> None:
    hw = {"backend": "cuda", "gpus": 1, "mem_bandwidth_gbs": 4300.0}
    measured = {"gpus": [{"uuid": "GPU-a", "mem_bandwidth_gbs": 4241.9}]}
    used, source = _hardware_for_roofline(hw, measured)
    assert (used["mem_bandwidth_gbs"], source) == (4241.9, "measured")
    row = {"median_tpot_ms": "5", "weight_bytes": str(4241.9e9 / 1000), "concurrency": "1"}
    assert row_columns(row, used, "llamacpp", {})["decode_ceiling_tok_s"] == pytest.approx(1000.0)
    assert _hardware_for_roofline(hw, {"gpus": [{"uuid": "GPU-a", "mem_bandwidth_error": "no torch"}]}) == (hw, "config")
    two = {"gpus": [{"mem_bandwidth_gbs": 4200.0}, {"mem_bandwidth_gbs": 4100.0}]}
    assert _hardware_for_roofline(hw, two)[0]["mem_bandwidth_gbs"] == 4100.0  # the slowest GPU bounds a step
    # per node and per GPU used: a row's own GPUs only, and no figure from another node's record
    three = {"host": "n1", "gpus": [{"uuid": "GPU-a", "mem_bandwidth_gbs": 4200.0},
                                    {"uuid": "GPU-b", "mem_bandwidth_gbs": 3000.0},
                                    {"uuid": "GPU-c", "mem_bandwidth_gbs": 4150.0}]}
    assert _hardware_for_roofline(hw, three, "gpu:GPU-a")[0]["mem_bandwidth_gbs"] == 4200.0
    assert _hardware_for_roofline(hw, three, "gpu:GPU-a,GPU-c")[0]["mem_bandwidth_gbs"] == 4150.0
    assert _hardware_for_roofline(hw, three, "gpu:GPU-z") == (hw, "config")  # measured on another node
    cpu = {"backend": "cpu", "mem_bandwidth_gbs": 20.0}
    host = {"host": "n1", "cpu": {"mem_bandwidth_gbs": 11.0}}
    assert _hardware_for_roofline(cpu, host, "host:n1/abc")[0]["mem_bandwidth_gbs"] == 11.0
    assert _hardware_for_roofline(cpu, host, "host:n2/def") == (cpu, "config")


def test_a_node_is_named_by_its_gpus_else_by_host_and_machine_id(tmp_path: Path) -> None:
    assert node_id(["GPU-b", "GPU-a"]) == "gpu:GPU-a,GPU-b"
    mid = tmp_path / "machine-id"
    mid.write_text("0123456789abcdef\n")
    assert node_id(None, mid).endswith("/0123456789ab") and node_id(None, mid).startswith("host:")
    assert "/" not in node_id([], tmp_path / "missing")



def test_the_summary_takes_each_rows_bandwidth_from_its_own_node() -> None:
    from bakeoff.results.derived import extend

    hw = {"backend": "cuda", "gpus": 1, "mem_bandwidth_gbs": 4300.0}
    facts = {"host": "n1", "gpus": [{"uuid": "GPU-a", "mem_bandwidth_gbs": 4000.0}]}
    rows = [{"experiment": "e", "engine": "llamacpp", "format": "f16", "node_id": n, "concurrency": "1"}
            for n in ("gpu:GPU-a", "gpu:GPU-z")]
    extend(rows, {"e": {"hardware": hw, "engines": {}, "config": {}}}, None, facts)
    assert [r["bandwidth_source"] for r in rows] == ["measured", "config"]


def test_a_server_start_id_tells_starts_apart_across_processes() -> None:
    """The count ``server_start`` restarts at 1 in a resumed job's process; the id (time and pid) does not repeat."""
    t = 1796515832.4471655
    assert start_id(t, 4242) == "20261206T001032.447165Z-4242"
    assert len({start_id(t, 4242), start_id(t, 4243), start_id(t + 1e-6, 4242)}) == 3


def _variant(models: Path, tmp_path: Path, fmt: str) -> dict:
    cfg = load_config([])
    model_dir = tmp_path / fmt
    shutil.copytree(models / fmt, model_dir)  # a unique path, to find this test's server
    return dict(engine_cfg=cfg.engines["llamacpp"].model_copy(update={"load": {}}), hardware=cfg.hardware,
                experiment="t", model="smollm2-135m", fmt=fmt, engine_name="llamacpp", model_dir=model_dir,
                tokenizer_dir=models / "fp16", toolchain_dir=cpu_toolchain(),
                show_progress=False)


def _kill_server_after(cell: Path, model_dir: Path) -> threading.Thread:
    """SIGKILL the server serving ``model_dir`` as soon as ``cell`` (a finished cell's record) exists."""
    def killer() -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not cell.exists():
            time.sleep(0.01)
        for p in psutil.process_iter(["pid", "cmdline"]):
            if str(model_dir) in " ".join(p.info["cmdline"] or []):
                os.killpg(p.info["pid"], signal.SIGKILL)

    t = threading.Thread(target=killer, daemon=True)
    t.start()
    return t


@pytest.mark.slow
def test_a_block_whose_server_was_killed_between_two_cells_is_flagged_and_left_out(gguf_models: Path,
                                                                                   tmp_path: Path) -> None:
    """Two real llama-servers (q4_k_m, f16), two blocks of two cells each. q4_k_m's server is killed once its
    block 0 has one cell; the job goes on (a new start) and is resumed (its failed cell re-run on another). Block
    0 of q4_k_m then holds cells of two starts: flagged, and out of the paired verdict, which says so."""
    load = LoadCfg(concurrency=[1, 2], prompt_len=[32], output_len=16, num_requests=4, warmup_requests=0, repeats=2)
    q4, f16 = _variant(gguf_models, tmp_path, "q4_k_m"), _variant(gguf_models, tmp_path, "f16")
    out_q4, out_f16 = tmp_path / "raw" / "q4", tmp_path / "raw" / "f16"
    killer = _kill_server_after(out_q4 / "c1-p32.json", q4["model_dir"])
    serve_load.run(ServeJob(load=load, out_dir=out_q4, **q4))
    killer.join()
    resumed = serve_load.run(ServeJob(load=load, out_dir=out_q4, **q4))  # the resume: re-runs what failed
    assert [c["status"] for c in resumed["cells"]] == ["ok"] * 4
    serve_load.run(ServeJob(load=load, out_dir=out_f16, **f16))
    data = rows([out_q4 / "cells.json", out_f16 / "cells.json"], {})
    assert all(re.fullmatch(r"\d{8}T\d{6}\.\d{6}Z-\d+", r["server_start_id"]) for r in data), data
    starts = {(r["format"], r["block"]): set() for r in data}
    for r in data:
        starts[(r["format"], r["block"])].add(r["server_start_id"])
    assert {k: len(v) for k, v in starts.items()} == {("q4_k_m", 0): 2, ("q4_k_m", 1): 1, ("f16", 0): 1,
                                                      ("f16", 1): 1}
    spread.extend(data)
    flags = {(r["format"], r["block"], r["concurrency"]): r["block_resumed"] for r in data}
    assert flags == {("q4_k_m", 0, 1): True, ("q4_k_m", 0, 2): True, ("q4_k_m", 1, 1): False,
                     ("q4_k_m", 1, 2): False, ("f16", 0, 1): False, ("f16", 0, 2): False, ("f16", 1, 1): False,
                     ("f16", 1, 2): False}
    for lead in fixed_leaders(data):  # one clean block left: no verdict, and the page says why
        assert lead.kind == spread.NO_VERDICT, lead.verdict
        assert lead.verdict.startswith("no verdict: fewer than 2 blocks once resumed blocks are left out (block 0: "
                                       "llamacpp-q4_k_m's cells came from 2 server starts)"), lead.verdict
