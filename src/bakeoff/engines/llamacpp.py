"""llama.cpp's ``llama-server`` from the pinned toolchain build."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import requests

from bakeoff.config.schema import HardwareCfg
from bakeoff.engines.base import Engine, register
from bakeoff.engines.flags import settings_to_flags
from bakeoff.engines.toolchain import toolchain_bin
from bakeoff.errors import BakeoffError
from bakeoff.layout import GGUF_NAME
from bakeoff.loadgen.prefix_cache import PrefixCacheCounters
from bakeoff.loadgen.scrape import MetricNames
from bakeoff.models.manifest import read_manifest
from bakeoff.models.weights import GIB, gguf_kv_bytes_per_token


@register
class LlamaCppEngine(Engine):
    name = "llamacpp"
    serves = "gguf"
    health_path = "/health"
    toolchain = "llamacpp"
    # KV occupancy comes from /slots: its Prometheus page has no KV gauge.
    metric_names = MetricNames(kv_usage=(), waiting=("llamacpp:requests_deferred",),
                               running=("llamacpp:requests_processing",), slots_kv=True)
    prefix_cache_counters = PrefixCacheCounters(hits="llamacpp:prompt_tokens_cached_total",
                                                computed="llamacpp:prompt_tokens_total")
    # With prefix_caching on: llama.cpp's own defaults for what the engine config may have turned off.
    CACHE_REUSE_TOKENS = 256  # --cache-reuse: the shortest chunk reused by shifting the KV cache
    CACHE_RAM_MIB = 8192  # --cache-ram: the host prompt cache

    @classmethod
    def prefix_caching_flags(cls, on: bool, settings: Mapping[str, Any]) -> tuple[list[str], tuple[str, ...]]:
        """On: a slot reuses the longest common prefix of its cached prompt (``--cache-prompt``), chunks further
        in by shifting its KV (``--cache-reuse``, the settings' value or 256), and idle slots' prompts are kept in
        a host prompt cache (``--cache-ram``, the settings' value where above 0, else 8192 MiB). Off: none of them
        (``--no-cache-prompt --cache-reuse 0 --cache-ram 0``): every prompt is computed whole."""
        if not on:
            flags = ["--no-cache-prompt", "--cache-reuse", "0", "--cache-ram", "0"]
        else:
            ram = settings.get("cache_ram")
            flags = ["--cache-prompt", "--cache-reuse", str(settings.get("cache_reuse") or cls.CACHE_REUSE_TOKENS),
                     "--cache-ram", str(ram if ram not in (None, 0) else cls.CACHE_RAM_MIB)]
        return flags, ("cache_prompt", "cache_reuse", "cache_ram")

    @classmethod
    def request_context(cls, settings: Mapping[str, Any], model_max_context: int | None = None) -> int:
        """llama-server splits ``ctx_size`` evenly between its ``parallel`` slots, and a request must stay one
        token short of its slot: 1024 + 256 tokens in a 1280-token slot came back ``truncated = 1`` (H200)."""
        cap = model_max_context or 1 << 30
        ctx = int(settings.get("ctx_size") or cap) // max(1, int(settings.get("parallel") or 1))
        return min(ctx - 1, cap)

    @classmethod
    def slots(cls, settings: Mapping[str, Any]) -> int | None:
        """``parallel`` slots, each with its own KV and timings; llama-server hands a request the least-recently
        used idle one, so c=1 requests walk through every slot and each must have served a warm-up."""
        return int(settings["parallel"]) if settings.get("parallel") else None

    def concurrency_limit(self, tokens_per_request: int) -> tuple[int | None, str]:
        """Its slots: the request past them waits for a whole request to finish (``parallel_set_by`` says whether
        the experiment, the capacity search or the memory chose their number)."""
        n = self.slots(self.spec.engine.settings)
        return (n, "llama.cpp --parallel") if n else (None, "")

    # The most slots (sequences) llama.cpp serves at once: LLAMA_MAX_SEQ in the pinned source's
    # src/llama-cparams.h; a larger --parallel fails the start ("n_seq_max must be <= 256").
    MAX_SLOTS = 256

    # Of the GPU memory the hardware config states, what the weights and compute buffers leave to the KV cache is
    # at most this share (llama.cpp allocates the whole cache at start: too large a cache fails the start).
    KV_MEMORY_SHARE = 0.85
    COMPUTE_RESERVE_BYTES = 2 * GIB

    @classmethod
    def sized_for_capacity(cls, settings: Mapping[str, Any], maximum: int, slot_tokens: int, model_dir: Path,
                           hardware: HardwareCfg) -> tuple[dict[str, Any], str]:
        """At least ``maximum`` slots of ``slot_tokens`` each (:meth:`sized_for_search`), within the KV memory the
        hardware config's GPUs leave after the GGUF's weights; on CPU memory does not bound them."""
        free: float | None = None
        kv: int | None = None
        if hardware.backend == "cuda" and hardware.gpu_memory_gib:
            ggufs = sorted(model_dir.glob("*.gguf"))
            weights = sum(f.stat().st_size for f in ggufs)
            free = (cls.KV_MEMORY_SHARE * hardware.gpu_memory_gib * GIB * max(1, hardware.gpus) - weights
                    - cls.COMPUTE_RESERVE_BYTES)
            kv = next((b for f in ggufs if (b := gguf_kv_bytes_per_token(f))), None)
        return cls.sized_for_search(settings, maximum, slot_tokens, kv, free)

    @classmethod
    def sized_for_search(cls, settings: Mapping[str, Any], maximum: int, slot_tokens: int,
                         kv_bytes_per_token: int | None, free_bytes: float | None) -> tuple[dict[str, Any], str]:
        """Settings whose slots let a capacity search reach ``maximum`` requests, each slot holding
        ``slot_tokens``: ``parallel`` at least ``maximum`` and ``ctx_size`` = slots x tokens, or as many slots as
        ``free_bytes`` of KV memory hold (``kv_bytes_per_token`` each), and never more than llama.cpp's own
        ``MAX_SLOTS``. Returns the settings and what set ``parallel``: ``experiment`` (already enough),
        ``search maximum``, ``KV memory``, or ``llama.cpp maximum``."""
        have = int(settings.get("parallel") or 0)
        per_slot = int(settings.get("ctx_size") or 0) // max(have, 1)
        if have >= maximum and per_slot >= slot_tokens:
            return dict(settings), "experiment"
        want, why = max(have, maximum), "search maximum"
        if kv_bytes_per_token and free_bytes is not None:
            fit = int(free_bytes // (kv_bytes_per_token * slot_tokens))
            if fit < want:  # never below what the experiment itself set
                want, why = (max(fit, 1), "KV memory") if fit > have else (max(have, 1), "experiment")
        if want > cls.MAX_SLOTS:
            want, why = cls.MAX_SLOTS, f"llama.cpp maximum ({cls.MAX_SLOTS} sequences)"
        slot = max(per_slot, slot_tokens)
        return {**settings, "parallel": want, "ctx_size": want * slot}, why

    @classmethod
    def hardware_flags(cls, hardware: HardwareCfg, settings: Mapping[str, Any]) -> list[str]:
        """Offload every layer, split across GPUs as configured; flags the settings set are left to them."""
        if hardware.backend != "cuda":
            return []
        out: list[str] = []
        if settings.get("n_gpu_layers") is None:
            out += ["--n-gpu-layers", "999"]
        if hardware.gpus > 1:
            if settings.get("split_mode") is None:
                out += ["--split-mode", hardware.llamacpp_split_mode]
            if hardware.llamacpp_tensor_split is not None and settings.get("tensor_split") is None:
                out += ["--tensor-split", ",".join(f"{x:g}" for x in hardware.llamacpp_tensor_split)]
        return out

    @classmethod
    def weight_shards(cls, hardware: Mapping[str, Any], settings: Mapping[str, Any]) -> int:
        """Row split: every GPU reads its slice of each matrix at once; the default layer split runs them in turn."""
        gpus = int(hardware.get("gpus") or 0)
        if gpus <= 1:
            return 1
        mode = settings.get("split_mode") or hardware.get("llamacpp_split_mode") or "layer"
        return gpus if mode == "row" else 1

    def command(self) -> list[str]:
        if self.spec.toolchain_dir is None:
            raise BakeoffError("the llamacpp engine needs a built toolchain (build/llamacpp/<commit>-<backend>)")
        e = self.spec.engine
        cmd = [str(toolchain_bin(self.spec.toolchain_dir, "llama-server")), "-m", str(self.spec.model_dir / GGUF_NAME),
               "--host", self.host, "--port", str(self.port), "--alias", self.spec.served_name]
        switch, taken = ([], ()) if e.settings.get("prefix_caching") is None else \
            self.prefix_caching_flags(bool(e.settings["prefix_caching"]), e.settings)
        cmd += settings_to_flags(e.settings, skip=("prefix_caching", *taken))
        cmd += switch
        cmd += self.hardware_flags(self.spec.hardware, e.settings)
        if e.api_key:
            cmd += ["--api-key", e.api_key]
        return cmd + list(e.extra_args)

    def versions(self) -> dict[str, str]:
        m = read_manifest(self.spec.toolchain_dir) if self.spec.toolchain_dir else {}
        return {"engine": "llamacpp", "engine_version": f"llama.cpp@{m.get('commit', '?')}",
                "llamacpp_build": m.get("backend", "?")}

    def started_facts(self) -> tuple[dict[str, Any], list[str]]:
        """The context of one slot as llama-server set it (``/v1/models``' meta), which caps ``ctx_size / parallel``
        at the model's training context (``n_ctx_slot`` in its server). The KV occupancy (``/slots``) is of
        these slots, and a prompt longer than one is cut, so a capped slot is said in every cell's note."""
        headers = {"Authorization": f"Bearer {self.spec.engine.api_key}"} if self.spec.engine.api_key else {}
        try:
            r = requests.get(f"{self.base_url}/v1/models", headers=headers, timeout=10)
            r.raise_for_status()
            meta = r.json()["data"][0]["meta"]
            slot, train = int(meta["n_ctx"]), int(meta["n_ctx_train"])
        except (requests.RequestException, KeyError, IndexError, TypeError, ValueError) as e:
            return {"slot_ctx": None}, [f"slot context not read from /v1/models: {type(e).__name__}"]
        settings = self.spec.engine.settings
        parallel = max(1, int(settings.get("parallel") or 1))
        asked = int(settings["ctx_size"]) // parallel if settings.get("ctx_size") else None
        notes = []
        if asked is not None and slot < asked:
            notes.append(f"llama-server capped each of its {parallel} slots at {slot} tokens (the model's training "
                         f"context is {train}), not ctx_size/parallel = {asked}: KV occupancy is of {parallel} x "
                         f"{slot} tokens")
        return {"slot_ctx": slot}, notes

    def capabilities(self) -> dict[str, Any]:
        # llama-server ignores `echo` and returns logprobs only for generated tokens (checked by the canary).
        return {"serves": self.serves, "parallel_slots": self.spec.engine.settings.get("parallel"),
                "prompt_logprobs": False}
