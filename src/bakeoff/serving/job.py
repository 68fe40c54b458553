"""What one serve-load job is given: the spec's config slices and the paths of its inputs, typed once.

Why a type: the command line, the stage and the tests all build the same job;
parsing the spec in one place keeps the three from drifting.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bakeoff.config.schema import DoctorCfg, EngineCfg, EvalCfg, HardwareCfg, LoadCfg
from bakeoff.config.stageargs import StageArgs
from bakeoff.loadgen.sizing import ClientSizer


@dataclass(frozen=True)
class ServeJob:
    """One variant's serve stage: its server config, load, quality config and where it reads and writes."""

    engine_cfg: EngineCfg
    hardware: HardwareCfg
    load: LoadCfg
    experiment: str
    model: str
    fmt: str
    engine_name: str
    model_dir: Path
    tokenizer_dir: Path
    out_dir: Path
    toolchain_dir: Path | None
    slos_ms: dict[str, float] | None = None
    show_progress: bool = True
    launcher_pid: int | None = None
    eval_cfg: EvalCfg = field(default_factory=EvalCfg)
    eval_toolchain_dir: Path | None = None
    synthetic: bool = False
    doctor: DoctorCfg = field(default_factory=DoctorCfg)
    # Its place in the experiment's schedule (bakeoff.loadgen.blocks): the block (repeat) it runs, and its
    # position in that block. None: every repeat in one job (a job built by hand, or by a test).
    block: int | None = None
    order: int | None = None
    # The experiment's resolved config hash (bakeoff.composition.compose.config_hash) this job serves under; stamped
    # on every row it indexes, so the summary can refuse rows of two configs.
    config_hash: str = ""
    # The cells measured on this job's server so far, from which ``load.client.workers: auto`` sizes the next.
    sizer: ClientSizer = field(default_factory=ClientSizer, compare=False)
    # The server starts (Session.starts) whose fixed slots have all served a warm-up: later cells and probes on
    # the same start warm only the slots they use.
    slots_warmed: set[int] = field(default_factory=set, compare=False)

    def slots_to_warm(self, start: int, slots: int | None) -> int | None:
        """``slots`` where this server start has not warmed them all yet (marking it), else None."""
        if not slots or start in self.slots_warmed:
            return None
        self.slots_warmed.add(start)
        return slots

    @classmethod
    def from_stage_args(cls, a: StageArgs) -> ServeJob:
        """The job of a ``serve-load`` or ``serve-block`` rule: its spec, artifacts and output folder."""
        return cls.from_spec(a.spec_json(), fmt=str(a.format), model_dir=a.dir("input"),
                             tokenizer_dir=a.dir("tokenizer"), out_dir=Path(a.out).parent,
                             toolchain_dir=a.dir("toolchain") if a.toolchain else None,
                             eval_toolchain_dir=a.dir("eval_toolchain") if a.eval_toolchain else None,
                             show_progress=sys.stderr.isatty(), launcher_pid=a.watch_pid)

    @classmethod
    def from_spec(cls, spec: dict[str, Any], *, fmt: str, model_dir: Path, tokenizer_dir: Path, out_dir: Path,
                  toolchain_dir: Path | None = None, eval_toolchain_dir: Path | None = None,
                  show_progress: bool = True, launcher_pid: int | None = None) -> ServeJob:
        """The job from the rule's spec (the composed config's slices for this variant) and its paths."""
        load = LoadCfg.model_validate(spec["load"])
        return cls(engine_cfg=EngineCfg.model_validate(spec["engine"]),
                   hardware=HardwareCfg.model_validate(spec["hardware"]), load=load,
                   experiment=spec["experiment"], model=spec["model"], fmt=fmt, engine_name=spec["engine_name"],
                   model_dir=model_dir, tokenizer_dir=tokenizer_dir, out_dir=out_dir, toolchain_dir=toolchain_dir,
                   slos_ms=load.slo_ms.as_dict() or None, show_progress=show_progress, launcher_pid=launcher_pid,
                   eval_cfg=EvalCfg.model_validate(spec.get("eval", {})), eval_toolchain_dir=eval_toolchain_dir,
                   synthetic=spec.get("model_source") == "synthetic",
                   doctor=DoctorCfg.model_validate(spec.get("doctor", {})),
                   block=spec.get("block"), order=spec.get("order"), config_hash=spec.get("config_hash", ""))
