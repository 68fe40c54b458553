"""The work a serving job does on a variant's server, as steps: fixed cells, the capacity search, samples, quality.

Why steps: every piece of work on a running server asks the same three things. What its result depends on (its
digest); whether a result kept from an earlier run was made with that digest (then it is put back in place and
the step has nothing to do); and how it runs on the server. The stages (bakeoff.stages.serve_load,
bakeoff.stages.serve_block) are then one loop, ``serve``: start the load server if a pending step needs it, run
every pending step on it in order, stop it, then run the steps that bring their own server (quality on an
engine's ``eval_server``), so the load server never shares the GPU with another.

A step whose server is down still runs: it writes the outcome that says so (a failed cell, a samples record with
the start's reason, a quality status), as every outcome is a result rather than a crash.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, ClassVar, Protocol

from bakeoff.engines import get_engine
from bakeoff.engines.session import Session
from bakeoff.layout import SAMPLES_FILE
from bakeoff.loadgen.cells import Cell, cell_note, record_base, requests_for, reusable, stable_seed, warmup_for
from bakeoff.models.artifacts import restore_kept, write_kept
from bakeoff.quality import lmeval
from bakeoff.quality.plan import QualityPlan
from bakeoff.quality.samples import generate, made_with, samples_hash
from bakeoff.serving import capacity
from bakeoff.serving.measure import measure, write_json
from bakeoff.serving.variant import Prepared


@dataclass
class LoadServer:
    """The variant's load server as the steps see it: its session, and how its last start went (``ok`` where it
    was never started)."""

    session: Session
    status: tuple[str, str] = ("ok", "")

    def start(self) -> None:
        self.status = self.session.start()

    @property
    def ok(self) -> bool:
        return self.status[0] == "ok"

    @property
    def up(self) -> bool:
        """Started well and still serving."""
        return self.ok and self.session.engine is not None and self.session.engine.alive()


class Step(Protocol):
    """One piece of work on the variant's server."""

    def digest(self) -> str:
        """What the step's result depends on."""

    def kept(self) -> bool:
        """A result made with ``digest()`` is in place (put back from the kept copy): nothing to run."""

    @property
    def needs_server(self) -> bool:
        """The load server is started for this step."""

    @property
    def own_server(self) -> bool:
        """The step brings its own server: it runs after the load server has stopped."""

    def run(self, server: LoadServer) -> None:
        """Do the work on ``server`` (or record why it could not)."""


def serve(p: Prepared, steps: Sequence[Step]) -> None:
    """Run the steps that have no kept result: on the load server (started only where one needs it, always
    stopped), then those that bring their own server."""
    pending = [s for s in steps if not s.kept()]
    server = LoadServer(p.session)
    try:
        if any(s.needs_server for s in pending):
            server.start()
            if not server.ok:
                print(f"{p.variant}: {server.status[0]}: {server.status[1]}", file=sys.stderr)
        for s in pending:
            if not s.own_server:
                s.run(server)
    finally:
        p.session.stop()
    for s in pending:
        if s.own_server:
            s.run(server)


@dataclass
class Cells:
    """The job's block's fixed cells not already made with these settings; restarts the server for a new repeat
    or after it died."""

    p: Prepared
    needs_server: ClassVar[bool] = True
    own_server: ClassVar[bool] = False

    def digest(self) -> str:
        return str(self.p.base["spec_hash"])

    @cached_property
    def pending(self) -> list[Cell]:
        p = self.p
        return [c for c in p.mine if not reusable(p.job.out_dir, c, self.digest(), requests_for(p.load, c.concurrency))]

    def kept(self) -> bool:
        return not self.pending

    def run(self, server: LoadServer) -> None:
        job, session, base, load, out_dir = self.p.job, server.session, self.p.base, self.p.load, self.p.job.out_dir
        versions = session.engine.versions() if session.engine else {}
        if not server.ok:
            for cell in self.pending:
                write_json(out_dir / f"{cell.name}.json",
                           {**record_base(base, cell, requests_for(load, cell.concurrency), versions, None),
                            "status": server.status[0], "reason": server.status[1], "completed": 0, "failed": 0})
            return
        served_repeat: int | None = None  # the repeat this server start has served
        for i, cell in enumerate(self.pending):
            # A new repeat gets a fresh server, so the spread across repeats includes restart drift.
            new_repeat = served_repeat is not None and cell.repeat != served_repeat
            if new_repeat or not session.engine or not session.engine.alive():
                session.stop()
                served_repeat = None
                server.start()  # a new repeat, or the previous cell killed it
                if not server.ok:
                    for rest in self.pending[i:]:
                        n = requests_for(load, rest.concurrency)
                        write_json(out_dir / f"{rest.name}.json",
                                   {**record_base(base, rest, n, versions, None), "status": "failed",
                                    "reason": f"server restart failed: {server.status[1]}", "completed": 0,
                                    "failed": n})
                    return
            served_repeat = cell.repeat
            slots = job.slots_to_warm(session.starts, get_engine(job.engine_cfg.plugin).slots(job.engine_cfg.settings))
            n, n_warm = requests_for(load, cell.concurrency), warmup_for(load, cell.concurrency, slots)
            measure(job, session, base, load, self.p.tokenizer, versions, cell, n=n, n_warm=n_warm,
                    seed=stable_seed(cell.concurrency, cell.prompt_len, cell.repeat), request_rate=load.request_rate,
                    notes=[cell_note(load, cell.concurrency, slots)])


@dataclass
class Capacity:
    """The capacity searches (bakeoff.serving.capacity), seeded by the variant's fixed cells; only where the
    load asks for them (``load.mode: capacity``) and on the last block."""

    p: Prepared
    needs_server: ClassVar[bool] = True
    own_server: ClassVar[bool] = False
    result: dict[str, Any] | None = None  # {"capacity": rows, "probes": records}, kept or made

    def digest(self) -> str:
        return capacity.capacity_hash(self.p.base["spec_hash"], self.p.load)

    def kept(self) -> bool:
        if self.p.load.mode != "capacity" or not self.p.last_block:
            return True
        self.result = capacity.reused(self.p.job.out_dir, self.digest())
        return self.result is not None

    def run(self, server: LoadServer) -> None:
        if not server.ok:
            return
        out_dir = self.p.job.out_dir
        fixed = [json.loads(f.read_text()) for c in self.p.cells if (f := out_dir / f"{c.name}.json").exists()]
        self.result = capacity.run(self.p.job, server.session, self.p.base, self.p.load, self.p.tokenizer, fixed)
        capacity.write(out_dir, self.digest(), self.result)


@dataclass
class Samples:
    """The fixed sample prompts generated by the variant's server (bakeoff.quality.samples). Where the server could
    not serve them, the record says why, and only a final outcome is kept (a failed start is retried next run)."""

    p: Prepared
    own_server: ClassVar[bool] = False

    def digest(self) -> str:
        return samples_hash(self.p.base["spec_hash"], self.p.job.eval_cfg.samples)

    @property
    def needs_server(self) -> bool:
        return bool(self.p.job.eval_cfg.samples.prompts)

    def kept(self) -> bool:
        path = self.p.job.out_dir / SAMPLES_FILE
        if not made_with(path, self.digest()):
            return False
        restore_kept(path)
        return True

    def run(self, server: LoadServer) -> None:
        job, engine, cfg = self.p.job, server.session.engine, self.p.job.eval_cfg.samples
        record: dict[str, Any] = {"samples_hash": self.digest(), "variant": self.p.variant}
        if server.up and engine is not None:
            record["samples"] = generate(engine.base_url, job.model, cfg.prompts, cfg.max_tokens,
                                         job.engine_cfg.api_key)
        else:  # no prompts configured, or the server could not serve them
            reason = "" if not cfg.prompts else f"{server.status[0]}: {server.status[1]}"
            final = not reason or server.status[0] == "unsupported"  # a failure is retried next run
            record.update(samples_hash=self.digest() if final else None, samples=[], reason=reason)
        write_kept(job.out_dir / SAMPLES_FILE, json.dumps(record, indent=2, default=str) + "\n")


@dataclass
class Quality:
    """The variant's quality score (bakeoff.quality.plan): on the load server where its engine can score prompts,
    else on the engine's ``eval_server``, started for the same artifact after the load server has stopped."""

    p: Prepared
    plan: QualityPlan | None = field(default=None, init=False)

    def _plan(self) -> QualityPlan:
        if self.plan is None:
            job = self.p.job
            self.plan = QualityPlan.make(job.engine_cfg, job.eval_cfg, self.p.manifest, job.out_dir, job.synthetic,
                                         job.eval_toolchain_dir)
        return self.plan

    def digest(self) -> str:
        return self._plan().digest

    def kept(self) -> bool:
        if self._plan().needed:
            lmeval.check_tasks(self.p.job.eval_cfg.tasks)  # an unknown task fails now, not after the load tests
        return not self._plan().needed

    @property
    def needs_server(self) -> bool:
        return self._plan().on_load_server

    @property
    def own_server(self) -> bool:
        return not self._plan().on_load_server

    def run(self, server: LoadServer) -> None:
        plan, job = self._plan(), self.p.job
        if plan.on_load_server:
            plan.run(server.session if server.up else None, server.status, self.p.tokenizer, job.tokenizer_dir,
                     job.model)
            return
        statuses = [json.loads((job.out_dir / f"{c.name}.json").read_text()) for c in self.p.cells]
        unsupported = [s for s in statuses if s["status"] == "unsupported"]
        if unsupported:  # the variant cannot run here; its quality is not measured on another route
            plan.record_status("unsupported", unsupported[0]["reason"])
        else:
            plan.run_on_eval_server(self.p.spec, self.p.tokenizer, job.tokenizer_dir, job.model)
