"""Stage: one server per (engine, format, engine settings) serves all its load cells.

For each cell (concurrency x prompt length x repeat) it writes the per-request
records (``<cell>.jsonl``) and the cell's summary (``<cell>.json``), then an
index (``cells.json``) that the summary rule reads. Cells whose summary already
says ``ok`` are skipped, so re-running the stage redoes only what is missing
or failed.

Outcomes, all of them results rather than crashes:

* ``ok`` / ``degraded`` -- every / some requests succeeded;
* ``unsupported`` -- the server exited while starting (the engine cannot run
  this combination); ``reason`` is the engine's own error line;
* ``failed`` -- the server did not become ready in time, or died mid-cell (the
  cell's requests fail with their errors; the server is restarted for the
  remaining cells).

The server is always stopped -- on success, error, SIGTERM or Ctrl-C.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bakeoff.artifacts import atomic_write_text
from bakeoff.engines import ServerSpec, get_engine
from bakeoff.engines.base import Engine
from bakeoff.errors import BakeoffError
from bakeoff.loadgen.metrics import summarize
from bakeoff.loadgen.prompts import make_prompts
from bakeoff.loadgen.runner import run_cell
from bakeoff.manifest import verify
from bakeoff.memory import PeakSampler
from bakeoff.proc import ServerStartError
from bakeoff.schema import EngineCfg, HardwareCfg, LoadCfg, request_context

INDEX = "cells.json"


@dataclass(frozen=True)
class Cell:
    concurrency: int
    prompt_len: int
    repeat: int

    @property
    def name(self) -> str:
        base = f"c{self.concurrency}-p{self.prompt_len}"
        return base if self.repeat == 0 else f"{base}-r{self.repeat}"


def cells_of(load: LoadCfg) -> list[Cell]:
    return [Cell(c, p, r) for c in load.concurrency for p in load.prompt_len for r in range(load.repeats)]


def requests_for(load: LoadCfg, concurrency: int) -> int:
    return max(load.num_requests, load.requests_per_concurrency * concurrency)


def _write_json(path: Path, data: Any) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, default=str) + "\n")


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in rows))


class Interrupted(BakeoffError):
    """The stage was signalled (Ctrl-C, SIGTERM, its launcher died); the server has been stopped."""


def _on_signal(signum: int, _frame: Any) -> None:
    raise Interrupted(f"interrupted by signal {signum}; the server was stopped and finished cells were kept")


def _alive(pid: int) -> bool:
    """Running and not a zombie (a killed launcher stays a zombie until its own parent reaps it)."""
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def watch_launcher(pid: int | None, interval_s: float = 0.5) -> None:
    """SIGTERM ourselves once ``pid`` (the launching snakemake; default: our parent) is gone.

    The server lives in its own process group, so it never sees the signals
    that end its launcher; this turns the launcher's death -- even SIGKILL --
    into our orderly stop. A launcher already gone when we start counts too.
    """
    target = pid or os.getppid()
    me = os.getpid()

    def loop() -> None:
        while True:
            if not _alive(target) or (pid is None and os.getppid() != target):
                os.kill(me, signal.SIGTERM)
                return
            time.sleep(interval_s)

    threading.Thread(target=loop, daemon=True, name="launcher-watch").start()


class Session:
    """The server for one variant, restartable after it dies."""

    def __init__(self, spec: ServerSpec, plugin: str) -> None:
        self.spec = spec
        self.plugin = plugin
        self.engine: Engine | None = None
        self.startup_s: float | None = None

    def start(self) -> tuple[str, str]:
        """Start and wait; returns ("ok", "") or (status, reason)."""
        self.engine = get_engine(self.plugin)(self.spec).start()
        try:
            self.startup_s = self.engine.ready()
            return "ok", ""
        except ServerStartError as e:
            reason = self.engine.failure_reason()
            self.engine.stop()
            if e.returncode is not None:
                return "unsupported", reason
            return "failed", f"not ready within {self.spec.engine.startup_timeout_s:.0f}s: {reason}"

    def stop(self) -> None:
        if self.engine is not None:
            self.engine.stop()


def run(*, engine_cfg: EngineCfg, hardware: HardwareCfg, load: LoadCfg, experiment: str, model: str, fmt: str,
        engine_name: str, model_dir: Path, tokenizer_dir: Path, out_dir: Path, toolchain_dir: Path | None,
        slos_ms: dict[str, float] | None = None, show_progress: bool = True,
        launcher_pid: int | None = None) -> dict[str, Any]:
    """Run every pending cell of one variant; returns the index written to ``cells.json``."""
    old = {s: signal.signal(s, _on_signal) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    if launcher_pid is not None:
        watch_launcher(launcher_pid)
    try:
        return _run(engine_cfg=engine_cfg, hardware=hardware, load=load, experiment=experiment, model=model, fmt=fmt,
                    engine_name=engine_name, model_dir=model_dir, tokenizer_dir=tokenizer_dir, out_dir=out_dir,
                    toolchain_dir=toolchain_dir, slos_ms=slos_ms, show_progress=show_progress)
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _run(*, engine_cfg: EngineCfg, hardware: HardwareCfg, load: LoadCfg, experiment: str, model: str, fmt: str,
         engine_name: str, model_dir: Path, tokenizer_dir: Path, out_dir: Path, toolchain_dir: Path | None,
         slos_ms: dict[str, float] | None, show_progress: bool) -> dict[str, Any]:
    from transformers import AutoTokenizer

    check_load_before_start(load, request_context(engine_cfg))
    manifest = verify(model_dir)
    verify(tokenizer_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    spec = ServerSpec(engine=engine_cfg, hardware=hardware, model_dir=model_dir, served_name=model,
                      log_path=out_dir / "server.log", toolchain_dir=toolchain_dir)
    session = Session(spec, engine_cfg.plugin)
    base = {"experiment": experiment, "model": model, "engine": engine_name, "format": fmt,
            "hardware": hardware.name, "output_len": load.output_len, "weight_bytes": manifest.get("weight_bytes"),
            "bits_per_weight": manifest.get("bits_per_weight"), "n_params": manifest.get("n_params"),
            "request_rate": load.request_rate, "engine_settings": engine_cfg.settings,
            "engine_extra_args": engine_cfg.extra_args}
    # Cells are reused only if made with exactly these settings (a changed setting re-runs them all).
    base["spec_hash"] = hashlib.sha256(json.dumps([base, load.model_dump(mode="json")], sort_keys=True,
                                                  default=str).encode()).hexdigest()[:16]
    cells = cells_of(load)

    def done(cell: Cell) -> bool:
        p = out_dir / f"{cell.name}.json"
        if not p.exists():
            return False
        prev = json.loads(p.read_text())
        return prev.get("status") in ("ok", "unsupported") and prev.get("spec_hash") == base["spec_hash"]

    pending = [c for c in cells if not done(c)]
    try:
        if pending:
            _run_pending(session, pending, base, load, tokenizer, out_dir, slos_ms, show_progress,
                         gpu=hardware.backend == "cuda")
    finally:
        session.stop()
    index = {"variant": base, "cells": [json.loads((out_dir / f"{c.name}.json").read_text()) for c in cells]}
    _write_json(out_dir / INDEX, index)
    return index


def _cell_base(base: dict, cell: Cell, n: int, versions: dict, startup_s: float | None) -> dict:
    return {**base, **versions, "cell": cell.name, "concurrency": cell.concurrency, "prompt_len": cell.prompt_len,
            "repeat": cell.repeat, "requests": n, "startup_s": startup_s}


def _run_pending(session: Session, pending: list[Cell], base: dict, load: LoadCfg, tokenizer: Any, out_dir: Path,
                 slos_ms: dict[str, float] | None, show_progress: bool, gpu: bool) -> None:
    status, reason = session.start()
    versions = session.engine.versions() if session.engine else {}
    if status != "ok":
        for cell in pending:
            n = requests_for(load, cell.concurrency)
            _write_json(out_dir / f"{cell.name}.json",
                        {**_cell_base(base, cell, n, versions, None), "status": status, "reason": reason,
                         "completed": 0, "failed": 0})
        print(f"{base['engine']}-{base['format']}: {status}: {reason}", file=sys.stderr)
        return
    count_tokens = lambda text: len(tokenizer.encode(text, add_special_tokens=False))  # noqa: E731
    for i, cell in enumerate(pending):
        if not session.engine or not session.engine.alive():
            status, reason = session.start()  # the previous cell killed it: restart for the rest
            if status != "ok":
                for rest in pending[i:]:
                    n = requests_for(load, rest.concurrency)
                    _write_json(out_dir / f"{rest.name}.json",
                                {**_cell_base(base, rest, n, versions, None), "status": "failed",
                                 "reason": f"server restart failed: {reason}", "completed": 0, "failed": n})
                return
        n = requests_for(load, cell.concurrency)
        seed = hash((cell.concurrency, cell.prompt_len, cell.repeat)) & 0xFFFF_FFFF
        prompts = make_prompts(tokenizer, cell.prompt_len, n + load.warmup_requests, seed=seed, tag=f"{cell.name}-")
        warm, measured = prompts[:load.warmup_requests], prompts[load.warmup_requests:]
        engine = session.engine
        assert engine is not None
        with PeakSampler(engine.pid() or os.getpid(), gpu=gpu) as mem:
            t_cell = time.time()
            res = run_cell(base_url=engine.base_url, model=base["model"], prompts=measured,
                           prompt_len=cell.prompt_len, output_len=load.output_len, concurrency=cell.concurrency,
                           request_rate=load.request_rate, warmup_prompts=warm, temperature=load.temperature,
                           api_key=engine.spec.engine.api_key, seed=seed, count_tokens=count_tokens,
                           label=f"{base['engine']}-{base['format']} {cell.name}", show_progress=show_progress)
        metrics = summarize(res.records, res.duration_s, slos_ms)
        died = not engine.alive()
        if died:
            cell_status, cell_reason = "failed", f"server died mid-cell: {engine.failure_reason()}"
        elif metrics["failed"] == 0:
            cell_status, cell_reason = "ok", ""
        elif metrics["completed"] == 0:
            cell_status, cell_reason = "failed", "; ".join(metrics["errors"])[:500]
        else:
            cell_status, cell_reason = "degraded", "; ".join(metrics["errors"])[:500]
        _write_jsonl(out_dir / f"{cell.name}.jsonl", [r.to_json() for r in res.records])
        _write_json(out_dir / f"{cell.name}.json",
                    {**_cell_base(base, cell, n, versions, session.startup_s), "status": cell_status,
                     "reason": cell_reason, **metrics, **res.client, "peak_rss_bytes": mem.peak_rss,
                     "peak_gpu_bytes": mem.peak_gpu, "started_utc": t_cell})


def check_load_before_start(load: LoadCfg, context_tokens: int) -> None:
    """Refuse impossible load parameters before any server starts."""
    if any(c < 1 for c in load.concurrency):
        raise BakeoffError(f"concurrency must be >= 1, got {load.concurrency}")
    need = max(load.prompt_len) + load.output_len
    if need > context_tokens:
        raise BakeoffError(f"prompt {max(load.prompt_len)} + output {load.output_len} = {need} tokens exceeds the "
                           f"context of {context_tokens}")
