"""Stage: kernel-only speed of a GGUF with ``llama-bench`` (pp512, tg128), for the served rows beside it.

Why: a served tok/s alone cannot say whether the gap to the roofline is the
kernels or the serving path (HTTP, scheduling, sampling, detokenizing).
llama-bench runs the same GGUF through the same build with nothing around it,
so ``served_over_kernel`` (a row's concurrency-1 output tok/s over tg128)
isolates the serving overhead, and ``kernel_tg_tok_s`` over the roofline the
kernels'. It runs with the server's own flash-attention setting and every
layer on the GPUs (as bakeoff.hardware.gpu offloads the server), on the node that
serves, as a DAG rule beside serve_load (both take the whole node).

The artifact is llama-bench's own ``-o json`` records plus the exact command,
the toolchain and the model's sha256s, written atomically.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from bakeoff.config.schema import HardwareCfg
from bakeoff.config.stageargs import StageArgs
from bakeoff.engines.base import THREAD_CAPS
from bakeoff.engines.toolchain import toolchain_bin
from bakeoff.errors import ToolchainError
from bakeoff.hardware.gpu import server_env
from bakeoff.layout import GGUF_NAME
from bakeoff.models.artifacts import atomic_write_text
from bakeoff.models.manifest import read_manifest, verify
from bakeoff.results.llamabench import parse_records

PROMPT_TOKENS = 512
GEN_TOKENS = 128
REPETITIONS = 5
COLUMNS = ["kernel_tg_tok_s", "kernel_pp_tok_s", "kernel_flash_attn", "served_over_kernel"]


def flash_attn_mode(value: Any) -> str:
    """The server's ``flash_attn`` setting as llama-bench's ``-fa on|off|auto``."""
    if value is None:
        return "auto"
    if isinstance(value, bool):
        return "on" if value else "off"
    v = str(value).strip().lower()
    if v in ("on", "1", "true", "enabled"):
        return "on"
    if v in ("off", "0", "false", "disabled"):
        return "off"
    if v == "auto":
        return "auto"
    raise ToolchainError(f"flash_attn setting {value!r} is not on/off/auto")


def command(bench: Path, gguf: Path, hw: HardwareCfg, fa: str, repetitions: int = REPETITIONS) -> list[str]:
    cmd = [str(bench), "-m", str(gguf), "-p", str(PROMPT_TOKENS), "-n", str(GEN_TOKENS), "-fa", fa,
           "-r", str(repetitions), "-o", "json"]
    if hw.backend == "cuda":
        cmd += ["-ngl", "99"]
        if hw.gpus > 1:
            cmd += ["-sm", hw.llamacpp_split_mode]
            if hw.llamacpp_tensor_split is not None:
                cmd += ["-ts", "/".join(f"{x:g}" for x in hw.llamacpp_tensor_split)]
    else:
        cmd += ["-ngl", "0"]
    return cmd


def run(*, hardware: HardwareCfg, model_dir: Path, toolchain_dir: Path, fa: str, out: Path,
        repetitions: int = REPETITIONS) -> dict[str, Any]:
    model = verify(model_dir)
    tc = read_manifest(toolchain_dir)
    cmd = command(toolchain_bin(toolchain_dir, "llama-bench"), model_dir / GGUF_NAME, hardware, fa, repetitions)
    env = {k: v for k, v in os.environ.items() if k not in THREAD_CAPS}
    env.update(server_env(hardware, os.environ))
    print("$ " + " ".join(cmd), file=sys.stderr, flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    sys.stderr.write(proc.stderr[-6000:])
    if proc.returncode != 0:
        raise ToolchainError(f"llama-bench failed ({proc.returncode}); the log above says why")
    records = json.loads(proc.stdout)
    tests = {m["test"]: m for m in parse_records(records)}
    result = {
        "command": cmd, "flash_attn": fa, "toolchain": {k: tc.get(k) for k in ("commit", "backend", "cuda_arch")},
        "model": model.get("model"), "format": model.get("format"),
        "model_files": [{k: f[k] for k in ("path", "sha256")} for f in model.get("files", [])],
        "tg_tok_s": tests[f"tg{GEN_TOKENS}"]["tok_s"], "tg_stddev": tests[f"tg{GEN_TOKENS}"]["stddev"],
        "pp_tok_s": tests[f"pp{PROMPT_TOKENS}"]["tok_s"], "pp_stddev": tests[f"pp{PROMPT_TOKENS}"]["stddev"],
        "records": records,
    }
    atomic_write_text(out, json.dumps(result, indent=2) + "\n")
    return result


def join(rows: list[dict[str, Any]], kernel_paths: list[Path]) -> list[str]:
    """Add the kernel columns to every llama.cpp row in place; returns their names.

    A row gets the result for its format and its server's flash-attention
    setting; ``served_over_kernel`` divides the output tok/s of the same
    variant's concurrency-1 cell at the row's prompt length by tg128.
    """
    kernels = {}
    for p in kernel_paths:
        k = json.loads(Path(p).read_text())
        kernels[(k["model"], k["format"], k["flash_attn"])] = k
    c1 = {(r.get("experiment"), r.get("engine"), r.get("format"), str(r.get("prompt_len")), str(r.get("repeat"))):
          r.get("output_throughput") for r in rows if str(r.get("concurrency")) == "1"}
    for r in rows:
        settings = r.get("engine_settings") or "{}"
        settings = json.loads(settings) if isinstance(settings, str) else settings
        try:
            fa = flash_attn_mode(settings.get("flash_attn"))
        except ToolchainError:
            continue
        k = kernels.get((r.get("model"), r.get("format"), fa))
        if k is None:
            continue
        r["kernel_tg_tok_s"] = k["tg_tok_s"]
        r["kernel_pp_tok_s"] = k["pp_tok_s"]
        r["kernel_flash_attn"] = fa
        served = c1.get((r.get("experiment"), r.get("engine"), r.get("format"), str(r.get("prompt_len")),
                         str(r.get("repeat"))))
        try:
            r["served_over_kernel"] = float(served) / k["tg_tok_s"] if served not in (None, "") else None
        except ValueError:
            r["served_over_kernel"] = None
    return list(COLUMNS)


def run_stage(a: StageArgs) -> None:
    """``bakeoff stage kernel-bench``: llama-bench on the GGUF (``--input``) with the server's flash attention."""
    run(hardware=a.hardware_cfg(), model_dir=a.dir("input"), toolchain_dir=a.dir("toolchain"), fa=a.flash_attn,
        out=Path(a.out))
