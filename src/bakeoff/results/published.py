"""Published numbers as data (``data/published_numbers.yaml``) and the comparison against a run.

Why data and not prose: a reproduction is only checkable if the numbers it
reproduces sit next to the measurements, with their source, in the summary.
Each ``measurement`` row says which cells it applies to (``match``: summary
column values) and which summary column it is (``metric``); a cell that
matches gets ``published_<metric>`` and ``<metric>_vs_published`` =
measured / published (a published range compares against its midpoint).
``setting`` rows are config values an experiment must use (the seed's exact
settings): :func:`check_settings` verifies a composed config against them.
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
    text: str | None = None

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


def matches(pub: Row, row: Mapping[str, Any]) -> bool:
    """Every key of the published row's ``match`` equals the cell's value."""
    return bool(pub.match) and all(_same(_cell_value(row, k), v) for k, v in pub.match.items())




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
    return [*cols, "published_refs"]


def compare(rows: list[dict[str, Any]], pub: Published) -> list[str]:
    """Fill measured/published ratio columns in place; returns the columns added."""
    derived = derive(rows)
    avail = set().union(*(r.keys() for r in rows)) if rows else set()
    ratio_cols = columns_for(pub, avail)
    for r in rows:
        for c in ratio_cols:
            r[c] = ""
        refs = []
        for m in pub.measurements():
            if m.metric not in avail or not matches(m, r):
                continue
            refs.append(m.id)
            r[f"published_{m.metric}"] = m.reference
            measured = number(r.get(m.metric), finite=False)
            if measured is not None and m.reference:
                r[f"{m.metric}_vs_published"] = measured / m.reference
        r["published_refs"] = " ".join(refs)
    return [*derived, *ratio_cols]


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
            if got != want and not (isinstance(got, (int, float)) and isinstance(want, (int, float)) and
                                    float(got) == float(want)):
                problems.append(f"{r.id}: {key} = {got!r}, published {want!r} ({r.where})")
    return problems
