"""Stage: one server per (engine, format, engine settings) serves all its load cells, then its quality.

For each cell (concurrency x prompt length x repeat) it writes the per-request
records (``<cell>.jsonl``) and the cell's summary (``<cell>.json``), then an
index (``cells.json``) that the summary rule reads. Cells whose summary already
says ``ok`` are skipped, so re-running the stage redoes only what is missing
or failed.

On the same server it then generates the fixed sample prompts
(``samples.json``) and, where the engine can score prompts (vLLM), runs the
quality evaluation (``quality.json``, bakeoff.stages.evaluate): the issue's
rule is that a variant is evaluated on the very server its load tests used.
Engines that cannot score prompts (llama-server) name an ``eval_server`` for
the same artifact, started after the load server is stopped. Quality and
samples are reused like cells, when made with the same settings.

Outcomes, all of them results rather than crashes:

* ``ok`` / ``degraded`` -- every / some requests succeeded;
* ``unsupported`` -- the server exited while starting with one of the engine's
  known refusals (``Engine.unsupported_patterns``: this build or hardware cannot
  run the format); ``reason`` is the engine's own error line;
* ``failed`` -- any other start failure (a resource such as memory or a port,
  a bad flag, a program that cannot run), a server not ready in time, or one that died mid-cell (the
  cell's requests fail with their errors; the server is restarted for the
  remaining cells).

The server is always stopped -- on success, error, SIGTERM or Ctrl-C.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bakeoff.config.schema import EngineCfg, EvalCfg, HardwareCfg, LoadCfg
from bakeoff.engines import ServerSpec, get_engine
from bakeoff.engines.base import Engine
from bakeoff.engines.container import ImagePullError
from bakeoff.errors import BakeoffError
from bakeoff.hardware.memory import PeakSampler
from bakeoff.layout import CELLS_INDEX, EVAL_SERVER_LOG, SAMPLES_FILE, SERVER_LOG, cell_name, variant_name
from bakeoff.loadgen.cellwindow import MeasuredWindow
from bakeoff.loadgen.metrics import summarize
from bakeoff.loadgen.prompts import make_prompts
from bakeoff.loadgen.runner import run_cell
from bakeoff.models.artifacts import atomic_write_text
from bakeoff.models.manifest import verify
from bakeoff.proc import ServerStartError
from bakeoff.quality import lmeval
from bakeoff.quality.canary import CanaryError
from bakeoff.quality.samples import generate
from bakeoff.stages import evaluate


@dataclass(frozen=True)
class Cell:
    concurrency: int
    prompt_len: int
    repeat: int

    @property
    def name(self) -> str:
        return cell_name(self.concurrency, self.prompt_len, self.repeat)


def cells_of(load: LoadCfg) -> list[Cell]:
    """Repeat-major: each repeat is a pass over the whole matrix (on its own server start, see _run_pending)."""
    return [Cell(c, p, r) for r in range(load.repeats) for c in load.concurrency for p in load.prompt_len]


def requests_for(load: LoadCfg, concurrency: int) -> int:
    return max(load.num_requests, load.requests_per_concurrency * concurrency)


def cell_spec_hash(base: dict, load: LoadCfg) -> str:
    """The settings a cell was made with: it is reused only when these are unchanged.

    The sweep axes (which concurrencies and prompt lengths run) are left out: a cell is named by its own
    concurrency and prompt length, so narrowing or widening the sweep keeps the cells already made. So is
    the per-format request map, which ``load`` already applied to ``num_requests`` for this variant. With
    one repeat the restart knob changes nothing, so it is left out too.
    """
    exclude = {"concurrency", "prompt_len", "num_requests_by_format"}
    exclude |= {"restart_between_repeats"} if load.repeats == 1 else set()
    load_spec = load.model_dump(mode="json", exclude=exclude)
    return hashlib.sha256(json.dumps([base, load_spec], sort_keys=True, default=str).encode()).hexdigest()[:16]


def _write_json(path: Path, data: Any) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, default=str) + "\n")


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in rows))


class Interrupted(BaseException):
    """The stage was signalled (Ctrl-C, SIGTERM, its launcher died); the server has been stopped.

    A BaseException, as KeyboardInterrupt is: raised from a signal handler it can land inside any code,
    and an ``except Exception`` there (a quality task's, a client library's) must not swallow the stop.
    """


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
        self.starts = 0  # server starts so far; each cell records the one it ran on (``server_start``)

    def start(self) -> tuple[str, str]:
        """Start and wait; returns ("ok", "") or (status, reason)."""
        self.engine = get_engine(self.plugin)(self.spec)
        self.starts += 1
        refusal = self.engine.refusal_before_start()
        if refusal is not None:
            return type(self.engine).start_failure_status(refusal), refusal
        try:
            self.engine.prepare()  # the image pull: its own step, outside the startup timeout
        except ImagePullError as e:
            return "failed", str(e)
        try:
            self.engine.start()
        except OSError as e:  # the server's program could not be run at all (missing, not executable)
            return "failed", f"could not start the server: {type(e).__name__}: {e}"
        try:
            self.startup_s = self.engine.ready()
            return "ok", ""
        except ServerStartError as e:
            reason = self.engine.failure_reason()
            self.engine.stop()
            if e.returncode is not None:
                return type(self.engine).start_failure_status(reason), reason
            return "failed", f"not ready within {self.spec.engine.startup_timeout_s:.0f}s: {reason}"

    def stop(self) -> None:
        if self.engine is not None:
            self.engine.stop()


def run(*, engine_cfg: EngineCfg, hardware: HardwareCfg, load: LoadCfg, experiment: str, model: str, fmt: str,
        engine_name: str, model_dir: Path, tokenizer_dir: Path, out_dir: Path, toolchain_dir: Path | None,
        slos_ms: dict[str, float] | None = None, show_progress: bool = True,
        launcher_pid: int | None = None, eval_cfg: EvalCfg | None = None, eval_toolchain_dir: Path | None = None,
        synthetic: bool = False) -> dict[str, Any]:
    """Run every pending cell of one variant; returns the index written to ``cells.json``."""
    with stop_on_signals(launcher_pid):
        return _run(engine_cfg=engine_cfg, hardware=hardware, load=load, experiment=experiment, model=model, fmt=fmt,
                    engine_name=engine_name, model_dir=model_dir, tokenizer_dir=tokenizer_dir, out_dir=out_dir,
                    toolchain_dir=toolchain_dir, slos_ms=slos_ms, show_progress=show_progress,
                    eval_cfg=eval_cfg or EvalCfg(), eval_toolchain_dir=eval_toolchain_dir, synthetic=synthetic)


@contextlib.contextmanager
def stop_on_signals(launcher_pid: int | None) -> Iterator[None]:
    """Turn SIGTERM, SIGINT, SIGHUP and the launcher's death into :class:`Interrupted` inside the block.

    The exception unwinds through the callers' ``finally`` blocks, which stop the server (and its container).
    """
    old = {s: signal.signal(s, _on_signal) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    if launcher_pid is not None:
        watch_launcher(launcher_pid)
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _run(*, engine_cfg: EngineCfg, hardware: HardwareCfg, load: LoadCfg, experiment: str, model: str, fmt: str,
         engine_name: str, model_dir: Path, tokenizer_dir: Path, out_dir: Path, toolchain_dir: Path | None,
         slos_ms: dict[str, float] | None, show_progress: bool, eval_cfg: EvalCfg, eval_toolchain_dir: Path | None,
         synthetic: bool) -> dict[str, Any]:
    from transformers import AutoTokenizer

    load, load_note = load.for_variant(engine_cfg.load, fmt)
    check_load_before_start(load, get_engine(engine_cfg.plugin).request_context(engine_cfg.settings))
    manifest = verify(model_dir)
    verify(tokenizer_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    spec = ServerSpec(engine=engine_cfg, hardware=hardware, model_dir=model_dir, served_name=model,
                      log_path=out_dir / SERVER_LOG, toolchain_dir=toolchain_dir,
                      job_name=f"{experiment}-{model}-{variant_name(engine_name, fmt)}")
    session = Session(spec, engine_cfg.plugin)
    base = {"experiment": experiment, "model": model, "engine": engine_name, "format": fmt,
            "hardware": hardware.name, "output_len": load.output_len,
            "weight_bytes": get_engine(engine_cfg.plugin).served_weight_bytes(manifest, engine_cfg.settings),
            "bits_per_weight": manifest.get("bits_per_weight"), "n_params": manifest.get("n_params"),
            "request_rate": load.request_rate, "engine_settings": engine_cfg.settings,
            "engine_extra_args": engine_cfg.extra_args, "load_note": load_note}
    base["spec_hash"] = cell_spec_hash(base, load)
    cells = cells_of(load)

    def done(cell: Cell) -> bool:
        p = out_dir / f"{cell.name}.json"
        if not p.exists():
            return False
        prev = json.loads(p.read_text())
        return prev.get("status") in ("ok", "unsupported") and prev.get("spec_hash") == base["spec_hash"]

    pending = [c for c in cells if not done(c)]
    quality = QualityPlan.make(engine_cfg, eval_cfg, manifest, out_dir, synthetic, eval_toolchain_dir)
    if quality.needed:
        lmeval.check_tasks(eval_cfg.tasks)  # an unknown task fails now, not after minutes of load tests
    samples_hash = hashlib.sha256(json.dumps([base["spec_hash"], eval_cfg.samples.model_dump()]).encode()).hexdigest()[:16]
    need_samples = not _same_hash(out_dir / SAMPLES_FILE, samples_hash)
    start_status = ("ok", "")
    try:
        if pending or quality.on_load_server or (need_samples and eval_cfg.samples.prompts):
            start_status = _run_pending(session, pending, base, load, tokenizer, out_dir, slos_ms, show_progress,
                                        gpu=hardware.backend == "cuda")
            engine = session.engine
            up = start_status[0] == "ok" and engine is not None and engine.alive()
            if up and need_samples and engine is not None:
                _write_json(out_dir / SAMPLES_FILE, {"samples_hash": samples_hash, "variant": variant_name(engine_name, fmt),
                                                "samples": generate(engine.base_url, model, eval_cfg.samples.prompts,
                                                                    eval_cfg.samples.max_tokens, engine_cfg.api_key)})
                need_samples = False
            if quality.on_load_server:
                quality.run(session if up else None, start_status, tokenizer, tokenizer_dir, model)
    finally:
        session.stop()
    if need_samples:  # no prompts configured, or the server could not serve them
        reason = "" if not eval_cfg.samples.prompts else f"{start_status[0]}: {start_status[1]}"
        final = not reason or start_status[0] == "unsupported"  # a failure is retried next run; unsupported is a result
        _write_json(out_dir / SAMPLES_FILE, {"samples_hash": samples_hash if final else None,
                                        "variant": variant_name(engine_name, fmt), "samples": [], "reason": reason})
    if quality.needed and not quality.on_load_server:
        unsupported = [c for c in cells if json.loads((out_dir / f"{c.name}.json").read_text())["status"] == "unsupported"]
        if unsupported:  # the variant cannot run here; its quality is not measured on another route
            quality.record_status("unsupported", json.loads((out_dir / f"{unsupported[0].name}.json").read_text())["reason"])
        else:
            quality.run_on_eval_server(spec, tokenizer, tokenizer_dir, model)
    index = {"variant": base, "cells": [json.loads((out_dir / f"{c.name}.json").read_text()) for c in cells]}
    _write_json(out_dir / CELLS_INDEX, index)
    return index


def _same_hash(path: Path, digest: str) -> bool:
    return path.exists() and json.loads(path.read_text()).get("samples_hash") == digest


@dataclass
class QualityPlan:
    """Whether and where this variant's quality is scored (see bakeoff.stages.evaluate)."""

    engine_cfg: EngineCfg
    eval_cfg: EvalCfg
    out_dir: Path
    digest: str
    needed: bool
    skip_reason: str
    eval_toolchain_dir: Path | None

    @classmethod
    def make(cls, engine_cfg: EngineCfg, eval_cfg: EvalCfg, manifest: dict, out_dir: Path, synthetic: bool,
             eval_toolchain_dir: Path | None) -> QualityPlan:
        route = (engine_cfg.eval_server or engine_cfg).model_dump(mode="json", include={"plugin", "settings"})
        digest = evaluate.eval_hash(eval_cfg, {**route, "same_server": engine_cfg.eval_server is None},
                                    manifest.get("sha256") or json.dumps(manifest.get("files", []), sort_keys=True))
        skip = ("synthetic weights: quality is not meaningful" if synthetic
                else "" if eval_cfg.tasks else "no eval.tasks configured")
        needed = not evaluate.reusable(out_dir, digest)
        plan = cls(engine_cfg, eval_cfg, out_dir, digest, needed and not skip, skip, eval_toolchain_dir)
        if needed and skip:
            plan.record_status("skipped", skip)
        return plan

    @property
    def on_load_server(self) -> bool:
        return self.needed and self.engine_cfg.eval_server is None

    def record_status(self, status: str, reason: str, **extra: Any) -> None:
        evaluate.write(self.out_dir, {"status": status, "reason": reason, "eval_hash": self.digest, **extra})

    def run(self, session: Session | None, start_status: tuple[str, str], tokenizer: Any, tokenizer_dir: Path,
            model: str, route: str = "load server") -> None:
        if session is None or session.engine is None:
            status, reason = start_status if start_status[0] != "ok" else ("failed", "the server died before evaluation")
            self.record_status(status, reason, route=route)
            return
        engine = session.engine
        if not engine.capabilities().get("prompt_logprobs"):
            self.record_status("unsupported", f"{engine.name} cannot score prompts and no eval_server is configured",
                               route=route)
            return
        ctx = type(engine).request_context(engine.spec.engine.settings) - 1  # lm-eval's windows + the 1 token it asks to generate
        try:
            scores = evaluate.score(base_url=engine.base_url, model=model, api_key=engine.spec.engine.api_key,
                                    tokenizer=tokenizer, tokenizer_dir=tokenizer_dir, eval_cfg=self.eval_cfg,
                                    max_length=ctx, out_dir=self.out_dir)
        except CanaryError as e:
            self.record_status("unsupported", f"logprob canary failed on {engine.name}: {e}", route=route)
            return
        except BakeoffError:
            raise  # a configuration error (unknown task): stop the stage with its message
        except Exception as e:  # lm-eval or the server broke: a result, with the reason
            alive = engine.alive()
            why = f"{type(e).__name__}: {e}" if alive else f"server died during evaluation: {engine.failure_reason()}"
            self.record_status("failed", why[:800], route=route)
            return
        self.record_status("ok", "", route=route, eval_engine=engine.versions(), **scores)

    def run_on_eval_server(self, load_spec: ServerSpec, tokenizer: Any, tokenizer_dir: Path, model: str) -> None:
        cfg = self.engine_cfg.eval_server
        assert cfg is not None
        spec = ServerSpec(engine=cfg, hardware=load_spec.hardware, model_dir=load_spec.model_dir,
                          served_name=model, log_path=self.out_dir / EVAL_SERVER_LOG,
                          toolchain_dir=self.eval_toolchain_dir, job_name=f"{load_spec.job_name}-eval")
        session = Session(spec, cfg.plugin)
        try:
            status = session.start()
            self.run(session if status[0] == "ok" else None, status, tokenizer, tokenizer_dir, model,
                     route=f"{cfg.plugin} (same artifact)")
        finally:
            session.stop()


def _cell_base(base: dict, cell: Cell, n: int, versions: dict, startup_s: float | None) -> dict:
    # The config's engine name (e.g. llamacpp_np4) wins over the plugin's own ("engine": "llamacpp").
    return {**versions, **base, "cell": cell.name, "concurrency": cell.concurrency, "prompt_len": cell.prompt_len,
            "repeat": cell.repeat, "requests": n, "startup_s": startup_s}


def _run_pending(session: Session, pending: list[Cell], base: dict, load: LoadCfg, tokenizer: Any, out_dir: Path,
                 slos_ms: dict[str, float] | None, show_progress: bool, gpu: bool) -> tuple[str, str]:
    status, reason = session.start()
    versions = session.engine.versions() if session.engine else {}
    if status != "ok":
        for cell in pending:
            n = requests_for(load, cell.concurrency)
            _write_json(out_dir / f"{cell.name}.json",
                        {**_cell_base(base, cell, n, versions, None), "status": status, "reason": reason,
                         "completed": 0, "failed": 0})
        print(f"{base['engine']}-{base['format']}: {status}: {reason}", file=sys.stderr)
        return status, reason
    count_tokens = lambda text: len(tokenizer.encode(text, add_special_tokens=False))  # noqa: E731
    served_repeat: int | None = None  # the repeat this server start has served
    for i, cell in enumerate(pending):
        # A new repeat gets a fresh server, so the spread across repeats includes restart drift.
        new_repeat = load.restart_between_repeats and served_repeat is not None and cell.repeat != served_repeat
        if new_repeat or not session.engine or not session.engine.alive():
            session.stop()
            served_repeat = None
            status, reason = session.start()  # a new repeat, or the previous cell killed it
            if status != "ok":
                for rest in pending[i:]:
                    n = requests_for(load, rest.concurrency)
                    _write_json(out_dir / f"{rest.name}.json",
                                {**_cell_base(base, rest, n, versions, None), "status": "failed",
                                 "reason": f"server restart failed: {reason}", "completed": 0, "failed": n})
                return status, reason
        served_repeat = cell.repeat
        n = requests_for(load, cell.concurrency)
        seed = hash((cell.concurrency, cell.prompt_len, cell.repeat)) & 0xFFFF_FFFF
        prompts = make_prompts(tokenizer, cell.prompt_len, n + load.warmup_requests, seed=seed, tag=f"{cell.name}-")
        warm, measured = prompts[:load.warmup_requests], prompts[load.warmup_requests:]
        engine = session.engine
        assert engine is not None
        window = MeasuredWindow(engine, gpu=gpu)  # GPU telemetry and server metrics, warm-up excluded
        # The server's memory: its process tree's RSS, or its container's (never the docker client's);
        # GPU memory comes from the window, on the server's own GPUs.
        with PeakSampler(engine.pid() or os.getpid(), sample=engine.memory_bytes) as mem:
            t_cell = time.time()
            res = run_cell(base_url=engine.base_url, model=base["model"], prompts=measured,
                           prompt_len=cell.prompt_len, output_len=load.output_len, concurrency=cell.concurrency,
                           request_rate=load.request_rate, warmup_prompts=warm, temperature=load.temperature,
                           api_key=engine.spec.engine.api_key, seed=seed, count_tokens=count_tokens,
                           label=f"{base['engine']}-{base['format']} {cell.name}", show_progress=show_progress,
                           on_measure_start=window.start, on_measure_end=window.stop)
        t_end = time.time()
        metrics = summarize(res.records, res.duration_s, slos_ms)
        telemetry = window.columns(metrics["total_output_tokens"])
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
                     "memory_source": engine.memory_source(),
                     "peak_gpu_bytes": mem.peak_gpu, **telemetry, "started_utc": t_cell,
                     "ended_utc": t_end, "server_start": session.starts})
    return "ok", ""


def check_load_before_start(load: LoadCfg, context_tokens: int) -> None:
    """Refuse impossible load parameters before any server starts."""
    if any(c < 1 for c in load.concurrency):
        raise BakeoffError(f"concurrency must be >= 1, got {load.concurrency}")
    need = max(load.prompt_len) + load.output_len
    if need > context_tokens:
        raise BakeoffError(f"prompt {max(load.prompt_len)} + output {load.output_len} = {need} tokens exceeds the "
                           f"context of {context_tokens}")
