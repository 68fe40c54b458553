"""`bakeoff load` writes only its JSON on stdout (the progress bar goes to stderr), so it pipes into jq."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from bakeoff.loadgen.echo_server import serving
from bakeoff.models.synthetic import write_hf_tokenizer

BIN = Path(sys.executable).parent


def test_load_prints_pure_json_on_stdout_and_progress_on_stderr(tmp_path: Path) -> None:
    write_hf_tokenizer(tmp_path, n_vocab=512, context_length=512)
    with serving() as url:
        proc = subprocess.run([str(BIN / "bakeoff"), "load", "--url", url, "--model", "m", "--tokenizer", str(tmp_path),
                               "--concurrency", "2", "--prompt-len", "16", "--output-len", "8", "--num-requests", "4"],
                              capture_output=True, text=True, timeout=120,
                              env={**os.environ, "COLUMNS": "120"})
    assert proc.returncode == 0, proc.stderr
    metrics = json.loads(proc.stdout)  # the whole of stdout is one JSON document
    assert metrics["completed"] == 4 and metrics["total_output_tokens"] == 32
    assert "load" in proc.stderr and "4/4" in proc.stderr  # the progress bar, on stderr


def test_load_ramps_its_users_and_reads_latency_over_the_steady_span(tmp_path: Path) -> None:
    """``--start ramp``: the ramp's requests come on top of ``--num-requests``, which are the steady span's: with
    requests of 8 tokens 10 ms apart, longer than the 50 ms ramp, each of the 2 slots sends one in it."""
    proc = _ramped_load(tmp_path, token_delay_s=0.01, ramp_s=0.05)
    metrics = json.loads(proc.stdout)
    assert metrics["load_start"] == "ramp" and metrics["load_ramp_s"] == 0.05
    assert metrics["completed"] == 6 and metrics["steady_requests"] == 4 and "supply" not in proc.stderr


def test_load_says_so_where_its_ramp_drew_the_whole_supply(tmp_path: Path) -> None:
    """Against a server that answers at once, a 0.2 s ramp refills each slot many times: the ramp takes every
    prompt of its supply, fewer than ``--num-requests`` are sent after it, and the command says so."""
    proc = _ramped_load(tmp_path, token_delay_s=0.0, ramp_s=0.2)
    metrics = json.loads(proc.stdout)
    assert metrics["completed"] == 4 + 6 and metrics["steady_requests"] < 4
    assert "the ramp drew all 6 prompts of its supply" in proc.stderr and "--ramp-s" in proc.stderr


def _ramped_load(tmp_path: Path, *, token_delay_s: float, ramp_s: float) -> subprocess.CompletedProcess[str]:
    """``bakeoff load`` ramped, 2 users, 4 requests after the ramp, against the echo server; it must succeed."""
    write_hf_tokenizer(tmp_path, n_vocab=512, context_length=512)
    with serving(token_delay_s=token_delay_s) as url:
        proc = subprocess.run([str(BIN / "bakeoff"), "load", "--url", url, "--model", "m", "--tokenizer", str(tmp_path),
                               "--concurrency", "2", "--prompt-len", "16", "--output-len", "8", "--num-requests", "4",
                               "--start", "ramp", "--ramp-s", str(ramp_s)],
                              capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc
