"""The load cells of one variant, and when a cell already on disk can be kept.

Why one place: a cell is named by its concurrency, prompt length and repeat,
and reused only while the settings it was made with (``cell_spec_hash``) are
unchanged, so a narrowed or interrupted run and the full one share their cells.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bakeoff.config.schema import LoadCfg
from bakeoff.errors import BakeoffError
from bakeoff.layout import cell_name
from bakeoff.loadgen import workload


@dataclass(frozen=True)
class Cell:
    concurrency: int
    prompt_len: int
    repeat: int
    label: str = ""  # a capacity probe's own name (bakeoff.layout.probe_name)

    @property
    def name(self) -> str:
        return self.label or cell_name(self.concurrency, self.prompt_len, self.repeat)


def cells_of(load: LoadCfg) -> list[Cell]:
    """Repeat-major: each repeat is a pass over the whole matrix (on its own server start)."""
    return [Cell(c, p, r) for r in range(load.repeats) for c in load.concurrency for p in load.prompt_len]


def stable_seed(*parts: object) -> int:
    """A 32-bit seed from ``parts`` that is the same in every process (``hash()`` of a str is salted per process)."""
    return int.from_bytes(hashlib.sha256(json.dumps([str(p) for p in parts]).encode()).digest()[:4], "big")


def requests_for(load: LoadCfg, concurrency: int) -> int:
    """Measured requests of a cell: the per-concurrency override, else max(num_requests, per-slot x c)."""
    if concurrency in load.num_requests_by_concurrency:
        n = load.num_requests_by_concurrency[concurrency]
    else:
        n = max(load.num_requests, load.requests_per_concurrency * concurrency)
    if load.workload.kind != "fixed":  # a workload may size its cells itself (bakeoff.loadgen.workload.requests)
        return workload.requests(load, n, concurrency)
    return n


def warmup_for(load: LoadCfg, concurrency: int, slots: int | None = None) -> int:
    """Uncounted warm-up requests of a cell, sent all at once: enough to touch every slot it uses, and
    every one of the server's ``slots`` where it has fixed ones (a c=1 cell on 4 llama.cpp slots uses all 4)."""
    return max(load.warmup_requests, load.warmup_per_slot * max(concurrency, slots or 0))


def cell_note(load: LoadCfg, concurrency: int, slots: int | None = None) -> str:
    """What a cell's load did beyond the configured defaults, for its ``load_note``: warm-up, request count."""
    n, w = requests_for(load, concurrency), warmup_for(load, concurrency, slots)
    parts = [f"warm-up: {w} requests at concurrency {max(concurrency, w)}, uncounted"]
    if concurrency in load.num_requests_by_concurrency:
        parts.append(f"{n} requests at c={concurrency} (load.num_requests_by_concurrency)")
    waves, tail = divmod(n, concurrency)
    if concurrency > 1 and tail and load.request_rate is None:
        parts.append(f"{n} requests = {waves} waves of {concurrency} + a tail of {tail}")
    return "; ".join(parts)


def cell_spec_hash(base: dict, load: LoadCfg) -> str:
    """The settings a cell was made with: it is reused only when these are unchanged.

    The sweep axes (which concurrencies and prompt lengths run) are left out: a cell is named by its own
    concurrency and prompt length, so narrowing or widening the sweep keeps the cells already made. So are
    the per-format and per-concurrency request maps (a cell's own request count is in its record and
    checked by :func:`reusable`), the block seed, which orders the servers, not what a cell sends, and the
    capacity search, which runs after the cells, and the client's worker count, which changes how the requests
    are sent, not what is sent (each cell records its own ``client_workers``). The ``fixed`` workload is left
    out too, so every cell made before workloads existed keeps its hash; any other workload is in, with the
    sha256 of the files it reads (a trace, or the statistics one is drawn from).
    """
    exclude = {"concurrency", "prompt_len", "num_requests_by_format", "num_requests_by_concurrency", "block_seed",
               "mode", "capacity", "client"}
    if load.workload.kind == "fixed":
        exclude.add("workload")
    load_spec = load.model_dump(mode="json", exclude=exclude)
    if load.workload.kind != "fixed":
        load_spec["workload_files"] = workload.source_digest(load)
    return hashlib.sha256(json.dumps([base, load_spec], sort_keys=True, default=str).encode()).hexdigest()[:16]


def reusable(out_dir: Path, cell: Cell, spec_hash: str, requests: int | None = None) -> bool:
    """The cell's summary exists, is a result (``ok`` or ``unsupported``), was made with these settings and,
    where ``requests`` is given, with that many requests."""
    p = out_dir / f"{cell.name}.json"
    if not p.exists():
        return False
    prev = json.loads(p.read_text())
    if requests is not None and prev.get("status") == "ok" and prev.get("requests") != requests:
        return False
    return prev.get("status") in ("ok", "unsupported") and prev.get("spec_hash") == spec_hash


def record_base(base: dict, cell: Cell, n: int, versions: dict, startup_s: float | None) -> dict[str, Any]:
    """The fields every cell record starts with, whatever its outcome."""
    # The config's engine name (e.g. llamacpp_np4) wins over the plugin's own ("engine": "llamacpp").
    return {**versions, **base, "cell": cell.name, "concurrency": cell.concurrency, "prompt_len": cell.prompt_len,
            "repeat": cell.repeat, "requests": n, "startup_s": startup_s}


def check_load_before_start(load: LoadCfg, context_tokens: int) -> None:
    """Refuse impossible load parameters before any server starts."""
    if any(c < 1 for c in load.concurrency):
        raise BakeoffError(f"concurrency must be >= 1, got {load.concurrency}")
    need = max(load.prompt_len) + load.output_len
    if need > context_tokens:
        raise BakeoffError(f"prompt {max(load.prompt_len)} + output {load.output_len} = {need} tokens exceeds the "
                           f"context of {context_tokens}")
    if load.workload.kind != "fixed":
        need, what = workload.longest_request(load)
        if need > context_tokens:
            raise BakeoffError(f"workload {load.workload.kind}: {what} needs {need} tokens, over the context of "
                               f"{context_tokens}")
