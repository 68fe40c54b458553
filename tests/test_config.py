"""Config composition: every option of every group composes; bad values fail clearly."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from bakeoff.composition.compose import compose_raw, config_hash, load_config, overrides_from_snakemake
from bakeoff.errors import ConfigError

from conftest import BIN, ROOT, planned_jobs, results_root, snakemake

CONF = ROOT / "conf"
GROUPS = ["model", "hardware", "load", "eval", "experiment"]


def _options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


@pytest.mark.parametrize("experiment", _options("experiment"))
def test_every_experiment_composes_and_validates(experiment: str) -> None:
    cfg = load_config([f"experiment={experiment}"], CONF)
    assert cfg.experiment.name == experiment
    assert cfg.variants(), "an experiment must have at least one cell variant"


@pytest.mark.parametrize("group,option", [(g, o) for g in GROUPS[:4] for o in _options(g)])
def test_every_group_option_composes(group: str, option: str) -> None:
    raw = compose_raw([f"{group}={option}"], CONF)
    assert group in raw


def test_default_is_smoke_on_cpu_with_embedded_model() -> None:
    cfg = load_config([], CONF)
    assert cfg.experiment.name == "smoke"
    assert cfg.hardware.backend == "cpu"
    assert cfg.model.source == "embedded"
    assert cfg.variants() == [("vllm", "fp16"), ("vllm", "fp8"), ("vllm", "fp8-dequant"),
                              ("llamacpp", "f16"), ("llamacpp", "q8_0"), ("llamacpp", "q4_k_m")]
    # fp8-dequant needs fp8 needs fp16; q8_0 needs f16
    assert cfg.needed_formats() == ["fp16", "fp8", "fp8-dequant", "f16", "q8_0", "q4_k_m"]


def test_blog_v100_is_the_seed_experiment() -> None:
    cfg = load_config(["experiment=blog_v100"], CONF)
    assert cfg.model.repo_id == "deepseek-ai/DeepSeek-R1-Distill-Qwen-7B"
    assert (cfg.hardware.gpus, cfg.hardware.cuda_arch, cfg.hardware.gpu_memory_gib) == (2, 70, 32)
    v = cfg.engines["vllm"].settings
    assert (v["tensor_parallel_size"], v["max_model_len"], v["gpu_memory_utilization"]) == (2, 8192, 0.9)
    ll = cfg.engines["llamacpp"].settings
    assert (ll["n_gpu_layers"], ll["ctx_size"], ll["parallel"]) == (99, 8192, 4)
    assert cfg.load.concurrency == [1, 8, 32] and cfg.load.prompt_len == [128, 1024]
    assert (cfg.load.output_len, cfg.load.num_requests, cfg.load.temperature) == (256, 100, 0.0)
    # the seed's three variants, plus fp8-dequant (FP8's stand-in on a V100) and the seed's open-loop vLLM load
    assert cfg.variants() == [("vllm", "fp16"), ("vllm", "fp8"), ("vllm", "fp8-dequant"), ("vllm_open", "fp16"),
                              ("vllm_open", "fp8"), ("vllm_open", "fp8-dequant"), ("llamacpp", "q4_k_m")]


@pytest.mark.parametrize(
    "override,expected",
    [
        ("load.concurrency=[0]", "load.concurrency.0"),
        ("load.output_len=-5", "load.output_len"),
        ("model=nope", "nope"),
        ("experiment=nope", "nope"),
        ("experiment.variants.vllm=[fp16,bogus]", "unknown format 'bogus'"),
        ("experiment.variants.vllm=[q4_k_m]", "engine 'vllm' serves hf"),
        ("engines.vllm.host=0.0.0.0", "api_key"),
        ("load.prompt_len=[100000]", "exceeds engine"),
        ("engines.vllm.plugin=nope", "engines.vllm.plugin: unknown engine plugin 'nope'"),
        ("engines.llamacpp.eval_server.plugin=nope", "engines.llamacpp.eval_server.plugin: unknown engine plugin"),
        ("hardware.backend=gpu", "hardware.backend"),
        ("load.bogus=1", "bogus"),
    ],
)
def test_bad_values_fail_with_a_message_naming_the_problem(override: str, expected: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_config([override], CONF)
    assert expected in str(e.value)


def test_snakemake_config_round_trips_to_hydra_overrides() -> None:
    got = overrides_from_snakemake(
        {"experiment": "blog_v100", "seed": [1, 8], "x": None, "overrides": "load.concurrency=[1,8] eval.limit=5"})
    assert got == ["experiment=blog_v100", "seed=[1,8]", "x=null", "load.concurrency=[1,8]", "eval.limit=5"]


def test_snakemake_plans_blog_v100_dag() -> None:
    # --forceall: plan every job even where this checkout already built shared parts (the source tree)
    out = snakemake("-n", "--forceall", "--cores", "1", "results/summary.csv", "--config", "experiment=blog_v100").stdout
    for rule in ["fetch_model", "model_fp16", "quantize_fp8", "convert_gguf", "quantize_gguf", "build_llamacpp",
                 "fetch_llamacpp", "summary"]:
        assert f"rule {rule}:" in out, rule
    assert "models/deepseek-r1-distill-qwen-7b/fp8/manifest.json" in out
    assert "models/deepseek-r1-distill-qwen-7b/q4_k_m/manifest.json" in out
    assert "-cuda70/manifest.json" in out  # the V100 CUDA build of the toolchain


def test_snakemake_passes_dotted_overrides_to_hydra() -> None:
    out = snakemake("-n", "--forceall", "--cores", "1", "results/summary.csv", "--config",
                    "overrides=experiment.variants.vllm=[fp16] experiment.variants.llamacpp=[q8_0]").stdout
    assert "models/smollm2-135m/q8_0/manifest.json" in out
    assert "models/smollm2-135m/q4_k_m/manifest.json" not in out
    assert "rule quantize_fp8:" not in out


def test_snakemake_refuses_bad_config_before_any_job() -> None:
    proc = snakemake("-n", "--cores", "1", "--config", "overrides=load.concurrency=[0]", check=False)
    assert proc.returncode != 0
    assert "load.concurrency.0" in proc.stdout + proc.stderr
    assert "rule " not in proc.stdout


def test_conf_dir_is_found_from_anywhere_in_the_repo(tmp_path: Path) -> None:
    from bakeoff.composition.compose import find_conf_dir

    assert find_conf_dir(ROOT / "src" / "bakeoff") == CONF
    with pytest.raises(ConfigError):
        find_conf_dir(tmp_path)


def test_rules_find_the_cli_without_the_venv_on_path(tmp_path: Path) -> None:
    """`.venv/bin/snakemake` from a shell whose PATH lacks the venv: a rule's `bakeoff ...` still runs."""
    root = results_root(tmp_path / "work")
    env = {**os.environ, "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([str(BIN / "snakemake"), "--cores", "1", "results/config.json"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (root / "results" / "config.json").is_file()


def test_rule_all_names_every_variants_index_so_a_deleted_one_is_measured_again() -> None:
    plan = snakemake("-n", "--cores", "1", "--config", "experiment=smoke").stdout
    jobs = dict(planned_jobs(plan))
    cfg = load_config(["experiment=smoke"])
    for engine, fmt in cfg.variants():
        assert f"results/raw/smoke/{cfg.model.name}/{engine}-{fmt}/cells.json" in jobs["all"]["input"]


def test_the_equivalence_margin_is_checked_and_changes_what_is_said_not_what_is_measured() -> None:
    """``answer.equivalence_margin_pct`` is positive (the error names the key) and outside the config hash, so a new
    margin re-makes the summary and pages but no serving job."""
    default, wider = load_config([]), load_config(["answer.equivalence_margin_pct=5"])
    assert default.answer.equivalence_margin_pct == 3.0 and wider.answer.equivalence_margin_pct == 5.0
    assert config_hash(default) == config_hash(wider)
    assert config_hash(default) != config_hash(load_config(["load.repeats=2"]))
    with pytest.raises(ConfigError, match=r"answer\.equivalence_margin_pct: Input should be greater than 0"):
        load_config(["answer.equivalence_margin_pct=0"])


def test_a_ramp_of_automatic_length_needs_a_warm_up() -> None:
    """An automatic ramp is the warm-up's median latency: with no warm-up the config is refused, naming the fix."""
    with pytest.raises(ConfigError, match=r"load\.warmup_requests or load\.warmup_per_slot above 0, or load\.ramp_s"):
        load_config(["load.start=ramp", "load.warmup_requests=0", "+load.warmup_per_slot=0"])
    assert load_config(["load.start=ramp", "load.warmup_requests=0", "+load.warmup_per_slot=0",
                        "load.ramp_s=2.5"]).load.ramp_s == 2.5
    assert load_config([]).load.capacity.start == "ramp" and load_config([]).load.start == "burst"


def test_an_engine_given_no_formats_serves_nothing_and_none_at_all_is_refused() -> None:
    """A record split by engine empties its parent's other engine (h100_quality_llamacpp: ``vllm: []``): that engine
    drops out of the variants, so no run check asks for vLLM on a node that carries none (mutant: kept, and
    ``run_problems`` would name it). With every engine emptied there is nothing to measure: refused, by name."""
    from bakeoff.composition.compose import run_problems

    cfg = load_config(["experiment=h100_quality_llamacpp"], CONF)
    assert cfg.experiment.variants == {"llamacpp": ["f16", "q8_0", "q4_k_m"]}
    assert "vllm" in cfg.engines and not any(p.startswith("engines.vllm") for p in run_problems(cfg))
    with pytest.raises(ConfigError, match="experiment.variants names no format for any engine"):
        load_config(["experiment=h100_quality_llamacpp", "experiment.variants.llamacpp=[]"], CONF)
