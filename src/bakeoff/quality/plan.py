"""Whether and where one variant's quality is scored, and the record that says how it went.

Why a plan: the serve stage must know before its first server starts whether
quality is still needed (a quality.json made with the same inputs is reused)
and whether it runs on the load server or on the engine's ``eval_server``.
Every outcome, a skip included, is written through ``record_status``.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bakeoff.config.schema import EngineCfg, EvalCfg
from bakeoff.engines import ServerSpec
from bakeoff.engines.session import Session
from bakeoff.errors import BakeoffError
from bakeoff.layout import EVAL_SERVER_LOG, QUALITY_FILE
from bakeoff.models.artifacts import restore_kept
from bakeoff.quality import evaluate
from bakeoff.quality.canary import CanaryError


@dataclass
class QualityPlan:
    """Whether and where this variant's quality is scored (see bakeoff.quality.evaluate)."""

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
        if not needed:
            restore_kept(out_dir / QUALITY_FILE)
            print(f"quality: reusing {QUALITY_FILE} (eval_hash {digest})", file=sys.stderr, flush=True)
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
