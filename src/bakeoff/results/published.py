"""Published numbers as data (``data/published_numbers.yaml``) and the comparison against a run.

Why data and not prose: a reproduction is only checkable if the numbers it
reproduces sit next to the measurements, with their source, in the summary.
Each ``measurement`` row says which cells it applies to (``match``: summary
column values) and which summary column it is (``metric``); a cell that
matches gets ``published_<metric>`` and ``<metric>_vs_published`` =
measured / published (a published range compares against its midpoint).
``setting`` rows are config values an experiment must use (the seed's exact
settings): :func:`check_settings` verifies a composed config against them.

Two things a published table leaves implicit are made explicit per row:
``stand_ins`` names the formats that ran in place of one this hardware cannot
run (the seed's "vLLM FP8" on a V100 is FP8 dequantized to FP16), and
``pooled`` names the cell keys one published number covers (the seed gives one
throughput for both prompt lengths): those cells are compared once, by their
mean. ``published_compared_as`` says which of the two happened.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from bakeoff.errors import ConfigError
from bakeoff.results.numbers import number
from bakeoff.results.spread import GROUP_KEY

DEFAULT_PATH = Path(__file__).resolve().parents[3] / "data" / "published_numbers.yaml"


class Source(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    title: str
    ref: str


class Row(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    id: str
    source: str
    where: str = ""
    kind: Literal["measurement", "setting", "fact"]
    match: dict[str, Any] = {}
    metric: str | None = None
    value: float | None = None
    low: float | None = None
    high: float | None = None
    as_published: str | None = None
    config: dict[str, Any] = {}
    # A setting whose list the config must contain rather than equal (bakeoff may add e.g. a fallback format).
    contains: bool = False
    text: str | None = None
    # Formats compared in place of match.format when no cell of that format measured the metric, in order.
    stand_ins: list[str] = []
    # Cell keys the published number does not distinguish: matching cells are compared once, by their mean.
    pooled: list[str] = []

    @model_validator(mode="after")
    def _shape(self) -> Row:
        if self.kind == "measurement":
            if not self.metric:
                raise ValueError("a measurement needs a metric (the summary column it compares)")
            has_range = self.low is not None and self.high is not None
            if (self.value is None) == (not has_range):
                raise ValueError("a measurement needs exactly one of: value, or low and high")
            if has_range and self.low > self.high:  # type: ignore[operator]
                raise ValueError(f"low {self.low} > high {self.high}")
        if self.kind == "setting" and not self.config:
            raise ValueError("a setting needs config: {dotted.key: value}")
        if self.kind == "fact" and not self.text:
            raise ValueError("a fact needs text")
        return self

    @property
    def reference(self) -> float:
        """The number a measurement is compared against (a range's midpoint)."""
        if self.value is not None:
            return self.value
        return (self.low + self.high) / 2.0  # type: ignore[operator]


class Published(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    sources: dict[str, Source]
    rows: list[Row]

    @model_validator(mode="after")
    def _refs(self) -> Published:
        ids = [r.id for r in self.rows]
        dup = sorted({i for i in ids if ids.count(i) > 1})
        if dup:
            raise ValueError(f"duplicate row ids: {dup}")
        for r in self.rows:
            if r.source not in self.sources:
                raise ValueError(f"row {r.id!r} cites unknown source {r.source!r}; known: {sorted(self.sources)}")
        return self

    def measurements(self) -> list[Row]:
        return [r for r in self.rows if r.kind == "measurement"]

    def metrics(self) -> list[str]:
        seen: list[str] = []
        for r in self.measurements():
            if r.metric not in seen:
                seen.append(r.metric)  # type: ignore[arg-type]
        return seen


def load(path: Path | str = DEFAULT_PATH) -> Published:
    p = Path(path)
    try:
        raw = yaml.safe_load(p.read_text())
    except FileNotFoundError:
        raise ConfigError(f"published numbers file {p} does not exist") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"published numbers file {p} is not valid YAML: {e}") from None
    try:
        return Published.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(f"published numbers file {p}: {e}") from None


def _same(a: Any, b: Any) -> bool:
    if a is None or a == "":
        return False
    try:
        return float(a) == float(b)
    except (TypeError, ValueError):
        return str(a) == str(b)


def _cell_value(row: Mapping[str, Any], key: str) -> Any:
    if key.startswith("engine_settings."):
        settings = row.get("engine_settings") or {}
        if isinstance(settings, str):
            try:
                settings = json.loads(settings) if settings else {}
            except json.JSONDecodeError:
                settings = {}
        return settings.get(key.split(".", 1)[1])
    return row.get(key)


def matches(pub: Row, row: Mapping[str, Any], fmt: str | None = None) -> bool:
    """Every key of the published row's ``match`` equals the cell's value (``fmt`` replacing its format)."""
    want = pub.match if fmt is None else {**pub.match, "format": fmt}
    return bool(want) and all(_same(_cell_value(row, k), v) for k, v in want.items())


def _measured(row: Mapping[str, Any], metric: str) -> float | None:
    return number(row.get(metric), finite=False)


def compared_cells(pub: Row, rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], str]:
    """The cells a published measurement is compared with, and a note when they are stand-ins."""
    direct = [r for r in rows if matches(pub, r)]
    if not pub.stand_ins or any(_measured(r, pub.metric or "") is not None for r in direct):
        return direct, ""
    fmt = pub.match.get("format")
    for alt in pub.stand_ins:
        alt_rows = [r for r in rows if matches(pub, r, alt)]
        if any(_measured(r, pub.metric or "") is not None for r in alt_rows):
            statuses = sorted({str(r.get("status") or "not run") for r in direct}) or ["not run"]
            return alt_rows, f"{alt} in place of {fmt} ({fmt}: {'/'.join(statuses)})"
    return direct, ""




def derive(rows: list[dict[str, Any]]) -> list[str]:
    """Add ``ppl_abs_delta_vs_fp16`` (ppl minus the fp16/f16 reference's ppl) where ``ppl`` exists.

    The seed and llama.cpp publish *absolute* perplexity differences; the
    reference is the same experiment and model's fp16 (else f16) cell. Returns
    the columns added (none while the summary has no ``ppl`` column).
    """
    if not any("ppl" in r for r in rows):
        return []
    refs: dict[tuple, float] = {}
    for fmt in ("f16", "fp16"):  # fp16 wins: written last
        for r in rows:
            if r.get("format") == fmt and (p := number(r.get("ppl"), finite=False)) is not None:
                refs[(r.get("experiment"), r.get("model"))] = p
    for r in rows:
        p = number(r.get("ppl"), finite=False)
        ref = refs.get((r.get("experiment"), r.get("model")))
        r["ppl_abs_delta_vs_fp16"] = p - ref if p is not None and ref is not None else ""
    return ["ppl_abs_delta_vs_fp16"]


def columns_for(pub: Published, available: Iterable[str]) -> list[str]:
    """Ratio columns for every published metric the summary has (fixed per data file and summary columns)."""
    avail = set(available)
    cols = []
    for m in pub.metrics():
        if m in avail:
            cols += [f"published_{m}", f"{m}_vs_published"]
    return [*cols, "published_refs", "published_compared_as"]


def _pool_key(row: Mapping[str, Any], pooled: list[str]) -> tuple:
    return tuple(str(row.get(k)) for k in GROUP_KEY if k not in pooled)


def compare(rows: list[dict[str, Any]], pub: Published) -> list[str]:
    """Fill measured/published ratio columns in place; returns the columns added."""
    derived = derive(rows)
    avail = set().union(*(r.keys() for r in rows)) if rows else set()
    ratio_cols = columns_for(pub, avail)
    for r in rows:
        for c in ratio_cols:
            r[c] = ""
        r["_refs"], r["_notes"] = [], []
    for m in pub.measurements():
        if m.metric not in avail:
            continue
        cells, note = compared_cells(m, rows)
        groups: dict[tuple, list[dict[str, Any]]] = {}
        for r in cells:
            groups.setdefault(_pool_key(r, m.pooled) if m.pooled else (id(r),), []).append(r)
        for group in groups.values():
            values = [v for r in group if (v := _measured(r, m.metric)) is not None]
            measured = sum(values) / len(values) if values else None
            pool_note = ""
            if m.pooled:
                over = ", ".join(f"{k} {'/'.join(sorted({str(r.get(k)) for r in group}, key=_natural))}"
                                 for k in m.pooled)
                pool_note = (f"{m.id}: one published number for {over}, compared once with the mean of {len(values)} rows"
                             if len(values) > 1 else
                             f"{m.id}: one published number for {over}; only this row measured it")
            for r in group:
                r["_refs"].append(m.id)
                r[f"published_{m.metric}"] = m.reference
                if measured is not None and m.reference:
                    r[f"{m.metric}_vs_published"] = measured / m.reference
                r["_notes"] += [n for n in (f"{m.id}: {note}" if note else "", pool_note) if n]
    for r in rows:
        r["published_refs"] = " ".join(r.pop("_refs"))
        r["published_compared_as"] = "; ".join(r.pop("_notes"))
    return [*derived, *ratio_cols]


def _natural(v: str) -> tuple:
    f = number(v, finite=False)
    return (0, f, "") if f is not None else (1, 0.0, v)


def _get(data: Mapping[str, Any], dotted: str) -> Any:
    cur: Any = data
    for part in dotted.split("."):
        if not isinstance(cur, Mapping) or part not in cur:
            raise KeyError(dotted)
        cur = cur[part]
    return cur


def check_settings(cfg_data: Mapping[str, Any], pub: Published, source: str = "seed") -> list[str]:
    """Mismatches between a composed config and the ``setting`` rows of one source (empty = exact).

    Rows with a ``match`` on ``hardware`` apply only when that hardware is the config's.
    """
    problems = []
    hw = cfg_data.get("hardware", {}).get("name")
    for r in pub.rows:
        if r.kind != "setting" or r.source != source:
            continue
        if "hardware" in r.match and r.match["hardware"] != hw:
            continue
        for key, want in r.config.items():
            try:
                got = _get(cfg_data, key)
            except KeyError:
                problems.append(f"{r.id}: config has no {key} (published {want!r})")
                continue
            if r.contains and isinstance(got, list) and isinstance(want, list):
                if not set(map(str, want)) <= set(map(str, got)):
                    problems.append(f"{r.id}: {key} = {got!r} lacks {sorted(set(map(str, want)) - set(map(str, got)))}, "
                                    f"published {want!r} ({r.where})")
                continue
            if got != want and not (isinstance(got, (int, float)) and isinstance(want, (int, float)) and
                                    float(got) == float(want)):
                problems.append(f"{r.id}: {key} = {got!r}, published {want!r} ({r.where})")
    return problems
