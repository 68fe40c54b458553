"""vLLM natively on a GPU node: its own interpreter and PYTHONPATH, never bakeoff's venv; docker only as an option.

Fast: the separate interpreter is a fresh venv made here (no site packages: bakeoff's own are invisible
to it), and the carried install is a folder holding stand-ins for ``vllm`` (its dist-info says 0.24.0;
its api_server module writes down how it was started) and a CUDA ``torch``. The command the engine
builds is run for real, under the environment the engine gives it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from bakeoff.config.schema import EngineCfg, HardwareCfg
from bakeoff.engines import ServerSpec
from bakeoff.engines.vllm import VllmEngine, interpreter_facts
from bakeoff.errors import BakeoffError

IMAGE = "vllm/vllm-openai:v0.6.3.post1"
API_SERVER = """
import importlib.util, json, os, sys
json.dump({"argv": sys.argv[1:], "executable": sys.executable, "PYTHONPATH": os.environ.get("PYTHONPATH"),
           "flashinfer_sampler": os.environ.get("VLLM_USE_FLASHINFER_SAMPLER"),
           "sees_pydantic": importlib.util.find_spec("pydantic") is not None},
          open(os.environ["RECORD_TO"], "w"))
"""


def carried_site(root: Path, cuda: str | None) -> Path:
    """A folder standing in for what node.sh installs: vllm 0.24.0 (dist-info + api_server) and a torch."""
    site = root / "site"
    api = site / "vllm" / "entrypoints" / "openai"
    api.mkdir(parents=True)
    for d in (site / "vllm", site / "vllm" / "entrypoints", api):
        (d / "__init__.py").write_text("")
    (api / "api_server.py").write_text(API_SERVER)
    (site / "vllm-0.24.0.dist-info").mkdir()
    (site / "vllm-0.24.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.24.0\n")
    (site / "torch").mkdir()
    version = "2.11.0+cu130" if cuda else "2.11.0+cpu"
    (site / "torch" / "__init__.py").write_text(f"__version__ = {version!r}\nclass version:\n    cuda = {cuda!r}\n")
    return site


@pytest.fixture(scope="module")
def node_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A separate interpreter: a venv without bakeoff's packages (as the node's python3 is without them)."""
    d = tmp_path_factory.mktemp("nodepy") / "venv"
    venv.create(d, with_pip=False, system_site_packages=False)
    return d / "bin" / "python"


def engine(tmp_path: Path, python: Path, site: Path | None, runtime: str = "auto", image: str | None = IMAGE,
           manifest: dict | None = None) -> VllmEngine:
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    if manifest is not None:
        (model / "manifest.json").write_text(json.dumps(manifest))
    hw = HardwareCfg(name="h200", backend="cuda", gpus=1, cuda_arch=90, vllm_image=image)
    e = EngineCfg(plugin="vllm", serves="hf", python=str(python), pythonpath=str(site) if site else None,
                  runtime=runtime, settings={"max_model_len": 4096, "dtype": "float16", "quantization": None})
    interpreter_facts.cache_clear()
    return VllmEngine(ServerSpec(engine=e, hardware=hw, model_dir=model, served_name="m", log_path=tmp_path / "s.log"))


def test_native_command_runs_under_the_carried_interpreter_and_pythonpath(tmp_path: Path, node_python: Path):
    site = carried_site(tmp_path, cuda="13.0")
    eng = engine(tmp_path, node_python, site,
                 manifest={"load_format": "dummy", "serve_settings": {"quantization": "fp8"}})
    assert eng.container_image is None  # a CUDA torch under that interpreter: native, though an image is named
    cmd, env = eng.command(), eng.env()
    assert cmd[:3] == [str(node_python), "-m", "vllm.entrypoints.openai.api_server"]
    record = tmp_path / "started.json"
    subprocess.run(cmd, env={**env, "RECORD_TO": str(record)}, check=True, timeout=60)
    got = json.loads(record.read_text())
    assert Path(got["executable"]).parent == node_python.parent  # the node's interpreter, not bakeoff's
    assert got["PYTHONPATH"] == str(site) and got["flashinfer_sampler"] == "0"
    assert got["sees_pydantic"] is False  # nothing of bakeoff's venv leaks into the server
    argv = got["argv"]
    assert argv[argv.index("--load-format") + 1] == "dummy" and argv[argv.index("--quantization") + 1] == "fp8"
    assert argv[argv.index("--model") + 1] == str((tmp_path / "model").resolve())
    assert eng.versions() == {"engine": "vllm", "engine_version": "0.24.0", "torch": "2.11.0+cu130",
                              "python": str(node_python), "torch_cuda": "13.0"}
    notes = eng.started_facts()[1]  # every row of this server says which FP8 and which weights it served
    assert any("--load-format dummy" in n for n in notes) and any("--quantization fp8" in n for n in notes)


def test_explicit_settings_win_over_the_manifest(tmp_path: Path, node_python: Path):
    site = carried_site(tmp_path, cuda="13.0")
    eng = engine(tmp_path, node_python, site, manifest={"serve_settings": {"quantization": "fp8"}})
    eng.spec.engine.settings["quantization"] = "awq"  # frozen model, mutable dict: as a composed config holds it
    cmd = eng.command()
    assert cmd[cmd.index("--quantization") + 1] == "awq" and cmd.count("--quantization") == 1


def test_a_cpu_torch_falls_back_to_the_image_and_docker_stays_an_option(tmp_path: Path, node_python: Path):
    site = carried_site(tmp_path, cuda=None)
    assert engine(tmp_path, node_python, site).container_image == IMAGE
    assert engine(tmp_path, node_python, site, runtime="native").container_image is None
    cuda_site = carried_site(tmp_path / "c", cuda="13.0")
    assert engine(tmp_path, node_python, cuda_site, runtime="container").container_image == IMAGE
    with pytest.raises(BakeoffError, match="runtime=container needs hardware.vllm_image"):
        engine(tmp_path, node_python, cuda_site, runtime="container", image=None)


def test_a_missing_carried_install_is_named_before_any_start(tmp_path: Path, node_python: Path):
    eng = engine(tmp_path, node_python, tmp_path / "not-carried", runtime="native")
    with pytest.raises(BakeoffError, match="not-carried does not exist.*node pack --vllm"):
        eng.command()
    eng = engine(tmp_path, tmp_path / "no-python", None, runtime="native")
    with pytest.raises(BakeoffError, match="no-python.*not an executable"):
        eng.command()


def test_bakeoffs_own_interpreter_is_the_default(tmp_path: Path):
    hw = HardwareCfg(name="cpu", backend="cpu", gpus=0)
    e = EngineCfg(plugin="vllm", serves="hf", settings={"kv_cache_memory_bytes": "1G"})
    eng = VllmEngine(ServerSpec(engine=e, hardware=hw, model_dir=tmp_path, served_name="m", log_path=tmp_path / "l"))
    assert eng.command()[0] == sys.executable and "VLLM_USE_FLASHINFER_SAMPLER" not in eng.env()


def test_the_versions_record_names_what_served_beside_this_environment(tmp_path: Path):
    from bakeoff.results.versions import served_versions

    summary = tmp_path / "summary.csv"
    summary.write_text("engine,engine_version,format\nvllm,0.24.0,fp16\nvllm,0.24.0,fp8-online\n"
                       "llamacpp,llama.cpp@0c1e570,q4_k_m\n")
    assert served_versions(summary) == {"served_llamacpp": "llama.cpp@0c1e570", "served_vllm": "0.24.0"}
    assert served_versions(tmp_path / "absent.csv") == {}
