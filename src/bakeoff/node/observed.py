"""What the committed GPU records observed, read back for the planner (bakeoff.node.plan): every cell's and
probe's latencies and throughput, each server's start, each job's logged time.

Why its own module: the planner's rates (bakeoff.node.rates) are made from these observations, and the check of a
plan against a record (bakeoff.node.plan_check) reads the same record; neither needs to know the files' layout.
"""

from __future__ import annotations

import json
import re
import tarfile
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bakeoff.errors import BakeoffError
from bakeoff.layout import cell_name, is_cell_stem
from bakeoff.node.readme import Call, read_calls


class PlanError(BakeoffError):
    """The plan cannot be made (a rate no record and no roofline gives)."""


# --------------------------------------------------------------------------- what the records measured
@dataclass(frozen=True)
class Obs:
    """One cell or probe a record measured."""

    record: str
    gpu: str
    bandwidth_gbs: float | None
    model: str
    engine: str
    plugin: str
    fmt: str
    name: str
    prompt: int
    c: int
    started: float
    seconds: float
    probe: bool
    values: Mapping[str, float]  # median/p99 TTFT/TPOT ms where measured
    startup_s: float | None
    weight_bytes: float | None
    fail_share: float | None  # a failing probe: the share of its requests it ran before it stopped


@dataclass(frozen=True)
class StartObs:
    """One serving job's start: the engine's own start and, for a finished job, the job's other time."""

    record: str
    gpu: str
    plugin: str
    first: bool  # the first start of this variant on the node (vLLM compiles its graphs)
    startup_s: float
    other_s: float | None


@dataclass
class Record:
    """What planning reads from one record folder (runs/<name>/)."""

    name: str
    folder: Path
    gpu: str
    bandwidth_gbs: float | None
    obs: list[Obs]
    calls: list[Call]
    bench: dict[tuple[str, ...], float]  # ("build",), ("model", model, format) -> seconds
    kv_tokens: dict[tuple[str, str], list[int]]  # (engine, format) -> vLLM's KV cache sizes
    quality_s: list[float]
    starts: list[StartObs] = field(default_factory=list)


def _plugin(rec: Mapping[str, Any]) -> str:
    """The engine plugin of a cell: its version names llama.cpp's builds; an engine entry's name starts with its
    plugin's (``llamacpp_cacheram``)."""
    if str(rec.get("engine_version", "")).startswith("llama.cpp") or str(rec.get("engine", "")).startswith("llamacpp"):
        return "llamacpp"
    return str(rec.get("engine", ""))


def _obs(name: str, gpu: str, bw: float | None, rec: Mapping[str, Any]) -> Obs | None:
    if not rec.get("started_utc") or not rec.get("ended_utc") or not rec.get("concurrency"):
        return None
    cell = str(rec.get("cell") or cell_name(rec["concurrency"], rec["prompt_len"], rec.get("repeat")))
    values = {k: float(rec[k]) for k in ("median_tpot_ms", "p99_tpot_ms", "median_ttft_ms", "p99_ttft_ms")
              if isinstance(rec.get(k), (int, float)) and rec[k] > 0 and (rec.get("completed") or 0) > 0}
    failed = rec.get("probe_passed") is False and rec.get("requests")
    return Obs(name, gpu, bw, str(rec.get("model", "")), str(rec["engine"]), _plugin(rec), str(rec["format"]), cell,
               int(rec["prompt_len"]), int(rec["concurrency"]), float(rec["started_utc"]),
               float(rec["ended_utc"]) - float(rec["started_utc"]), cell.startswith("cap-"), values,
               rec.get("startup_s"), rec.get("weight_bytes"),
               float(rec.get("completed") or 0) / float(rec["requests"]) if failed else None)


def _bench_key(path: str) -> tuple[str, ...] | None:
    """A benchmark file's job: the llama.cpp build, its scorer binding, or a model's format (``source``: the model
    itself)."""
    if re.search(r"logs/bench/build/llamacpp/[^/]+\.tsv$", path):
        return ("build",)
    if re.search(r"logs/bench/build/llamacpp-python/[^/]+\.tsv$", path):
        return ("binding",)
    if m := re.search(r"logs/bench/models/([^/]+)/([^/]+)\.tsv$", path):
        return ("model", m.group(1), m.group(2))
    return None


def _read_tarball(tgz: Path, name: str, gpu: str, bw: float | None) -> tuple[list[Obs], dict, dict, list[float]]:
    obs: list[Obs] = []
    bench: dict[tuple[str, ...], float] = {}
    logs: dict[str, str] = {}
    quality: list[float] = []
    with tarfile.open(tgz) as tar:
        for m in tar.getmembers():
            if not m.isfile() or "/kept/" in m.name:
                continue
            stem = Path(m.name).stem
            if m.name.startswith("results/raw/") and m.name.endswith(".json") and is_cell_stem(stem):
                if (o := _obs(name, gpu, bw, json.load(tar.extractfile(m)))) is not None:  # type: ignore[arg-type]
                    obs.append(o)
            elif m.name.endswith("/quality.json"):
                q = json.load(tar.extractfile(m))  # type: ignore[arg-type]
                if q.get("status") == "ok" and q.get("eval_s"):
                    quality.append(float(q["eval_s"]))
            elif m.name.endswith("/server.log"):
                logs[str(Path(m.name).parent)] = tar.extractfile(m).read().decode(errors="replace")  # type: ignore[union-attr]
            elif (key := _bench_key(m.name)) is not None:
                rows = tar.extractfile(m).read().decode().splitlines()  # type: ignore[union-attr]
                if len(rows) > 1:
                    bench[key] = float(rows[1].split("\t")[0])
    kv: dict[tuple[str, str], list[int]] = defaultdict(list)
    variants = {(o.engine, o.fmt) for o in obs}
    for folder, text in logs.items():
        sizes = [int(s.replace(",", "")) for s in re.findall(r"KV cache size: ([\d,]+) tokens", text)]
        key = next(((e, f) for (e, f) in variants if folder.endswith(f"/{e}-{f}")), None)
        if sizes and key is not None:
            kv[key] += sizes
    return obs, bench, dict(kv), quality


def load_record(folder: Path) -> Record | None:
    """The record in ``folder``, or None where it has no node tarball (a probe's notes, not a run)."""
    tgz = folder / "node-results.tgz"
    if not tgz.is_file():
        return None
    hw = json.loads((folder / "hardware.json").read_text()) if (folder / "hardware.json").is_file() else {}
    gpus = hw.get("gpus") or []
    gpu = str(gpus[0].get("name", "")) if gpus else ""
    bw = (gpus[0].get("mem_bandwidth_gbs") if gpus else None) or (hw.get("hardware_config") or {}).get("mem_bandwidth_gbs")
    obs, bench, kv, quality = _read_tarball(tgz, folder.name, gpu, bw)
    rec = Record(folder.name, folder, gpu, bw, obs, read_calls(folder), bench, kv, quality)
    rec.starts = _starts(rec)
    return rec


def in_window(job_start: float, job_end: float, o: Obs) -> bool:
    return job_start - 1 <= o.started <= job_end + 1  # the logs' stamps are whole seconds


def _starts(rec: Record) -> list[StartObs]:
    """Each serving job's start, in the record's call order: the first of a variant on the node or a later one."""
    seen: set[tuple[str, str]] = set()
    out: list[StartObs] = []
    for call in rec.calls:
        for job in call.jobs:
            if not job.rule.startswith("serve_"):
                continue
            key = (job.wildcards.get("engine", ""), job.wildcards.get("format", ""))
            s, e = job.started.timestamp(), (job.ended or call.ended).timestamp()
            inside = [o for o in rec.obs if (o.engine, o.fmt) == key and in_window(s, e, o)]
            ups = [float(o.startup_s) for o in inside if o.startup_s is not None]
            if not inside or not ups:
                continue  # nothing measured: its cells were kept, or it stopped before its first
            busy = sum(o.seconds for o in inside)
            other = e - s - busy - max(ups) if job.outcome == "finished" else None
            out.append(StartObs(rec.name, rec.gpu, inside[0].plugin, key not in seen, max(ups), other))
            seen.add(key)
    return out


def load_records(runs: Path, exclude: Iterable[str] = ()) -> list[Record]:
    """Every record under ``runs`` with a node tarball, but those named in ``exclude``."""
    skip = set(exclude)
    out = []
    for folder in sorted(p for p in runs.iterdir() if p.is_dir() and p.name not in skip):
        if (rec := load_record(folder)) is not None:
            out.append(rec)
    return out
