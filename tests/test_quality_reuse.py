"""A variant's quality.json is reused only while everything its score depends on is unchanged.

The record is written the way the serve stage writes it (``QualityPlan.record_status``
through ``evaluate.write``); the next ``QualityPlan.make`` then decides from it alone.
"""

from __future__ import annotations

import json
from pathlib import Path

from bakeoff.composition.compose import load_config
from bakeoff.config.schema import EngineCfg, EvalCfg
from bakeoff.layout import KEPT_DIR, QUALITY_FILE
from bakeoff.models.manifest import verify, write_manifest
from bakeoff.quality.plan import QualityPlan

EVAL = EvalCfg(tasks=["arc_easy"], limit=50)


def _artifact(root: Path, weights: bytes) -> dict:
    """A model directory with a real manifest, read back as the serve stage reads it."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "model.gguf").write_bytes(weights)
    write_manifest(root, kind="model-format", model="m", format="q4_k_m")
    return verify(root)


def _plan(engine: EngineCfg, eval_cfg: EvalCfg, manifest: dict, out: Path) -> QualityPlan:
    return QualityPlan.make(engine, eval_cfg, manifest, out, synthetic=False, eval_toolchain_dir=None)


def _setup(tmp_path: Path, weights: bytes = b"weights") -> tuple[EngineCfg, dict, Path]:
    """The default llama.cpp engine, a model artifact, and an empty variant directory."""
    out = tmp_path / "raw"
    out.mkdir()
    return load_config([]).engines["llamacpp"], _artifact(tmp_path / "model", weights), out


def test_a_recorded_score_is_reused_and_changed_inputs_are_rescored(tmp_path: Path) -> None:
    engine, manifest, out = _setup(tmp_path, b"weights v1")

    first = _plan(engine, EVAL, manifest, out)
    assert first.needed and not first.on_load_server  # llama-server scores on its eval_server
    first.record_status("ok", "", route="llamacpppy (same artifact)", tasks={"arc_easy": {"acc": 0.5}})
    assert json.loads((out / QUALITY_FILE).read_text())["eval_hash"] == first.digest

    again = _plan(engine, EVAL, manifest, out)
    assert not again.needed and again.digest == first.digest  # same inputs: the score stands

    fewer_docs = _plan(engine, EVAL.model_copy(update={"limit": 20}), manifest, out)
    assert fewer_docs.needed and fewer_docs.digest != first.digest

    new_weights = _plan(engine, EVAL, _artifact(tmp_path / "model", b"weights v2"), out)
    assert new_weights.needed and new_weights.digest != first.digest

    other_route = engine.model_copy(update={"eval_server": None})  # scored on the load server instead
    assert _plan(other_route, EVAL, manifest, out).needed

    # nothing above wrote: the record is still the first one, and still reused
    assert not _plan(engine, EVAL, manifest, out).needed


def test_the_score_is_reused_after_snakemake_deleted_the_declared_output(tmp_path: Path) -> None:
    """Snakemake removes quality.json before a rerun; the kept copy is what decides, and it is put back."""
    engine, manifest, out = _setup(tmp_path)
    first = _plan(engine, EVAL, manifest, out)
    first.record_status("ok", "", tasks={"arc_easy": {"acc": 0.5}})
    recorded = (out / QUALITY_FILE).read_text()
    (out / QUALITY_FILE).unlink()

    again = _plan(engine, EVAL, manifest, out)
    assert not again.needed
    assert (out / QUALITY_FILE).read_text() == recorded

    (out / KEPT_DIR / QUALITY_FILE).unlink()  # no kept copy: scored again, even beside a declared file
    (out / QUALITY_FILE).write_text(recorded)
    assert _plan(engine, EVAL, manifest, out).needed


def test_a_failed_score_is_tried_again(tmp_path: Path) -> None:
    engine, manifest, out = _setup(tmp_path)
    _plan(engine, EVAL, manifest, out).record_status("failed", "server died during evaluation")
    assert _plan(engine, EVAL, manifest, out).needed
