"""Sweeps: Hydra override syntax from the command line, expanded into one DAG.

Why here and not Hydra's ``--multirun``: Snakemake owns the DAG, so every
sweep point must be planned in one Snakemake invocation that shares the
model, format and toolchain jobs and writes one ``summary.csv``. A sweep is
given as Hydra sweep overrides, e.g.::

    snakemake --cores all --config sweep="engines.llamacpp.settings.parallel=4,32 engines.vllm.settings.enforce_eager=true,false"

Each combination is one *point*: its config is composed exactly like a plain
run (``load_config``), and its experiment name gets a readable suffix
(``smoke.parallel4``) so its cells live under their own
``results/raw/<experiment>/`` directory. Points may differ in anything that
only affects serving (engine settings and version/image, load, eval); they
must share the model, the formats and the llama.cpp toolchain, which are
built once for all points.

Every cell also carries its axis values: ``sweep`` (this point's swept
overrides) and ``overrides`` (every value differing from the experiment's own
defaults, which also covers DVC's ``-S`` overrides, where no override list
survives composition).
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bakeoff.composition.compose import (
    _hydra_value,
    config_hash,
    find_conf_dir,
    load_config,
    load_config_file,
    overrides_from_snakemake,
)
from bakeoff.config.schema import Config
from bakeoff.errors import BakeoffError, ConfigError
from bakeoff.models.artifacts import atomic_write_text

# Keys of `snakemake --config` that are not Hydra overrides.
SWEEP_KEY = "sweep"
COMPOSED_KEY = "composed"
# The config hash a GPU node's results were served under, where it is not the current config's (a record made by
# an earlier bakeoff): the summary takes their rows as they are (bakeoff.stages.summary.check_one_config).
SERVED_KEY = "served_config_hash"


@dataclass(frozen=True)
class Point:
    """One sweep point: its name (= its experiment name), swept overrides and validated config."""

    name: str
    sweep: tuple[str, ...]
    cfg: Config
    overrides: tuple[str, ...] = field(default=())

    @property
    def hash(self) -> str:
        return config_hash(self.cfg)


def parse_sweep(spec: str | Sequence[str] | None) -> list[list[str]]:
    """Hydra sweep overrides -> the list of override combinations (cartesian product, in order).

    ``a=1,2 b=x`` -> ``[["a=1", "b=x"], ["a=2", "b=x"]]``. Uses Hydra's own
    override parser, so ``range(1,4)``, ``choice(a,b)`` and quoting behave as
    in ``--multirun``. No sweep -> one empty combination.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    if not spec:
        return [[]]
    items = list(spec) if isinstance(spec, (list, tuple)) else shlex.split(str(spec))
    try:
        parsed = OverridesParser.create().parse_overrides(items)
    except HydraException as e:
        raise ConfigError(f"cannot parse sweep {items}: {e}") from None
    axes: list[list[str]] = []
    for o in parsed:
        key = o.get_key_element()
        if o.is_sweep_override():
            vals = [_hydra_value(v) for v in o.sweep_iterator()]
            if not vals:
                raise ConfigError(f"sweep axis {key!r} has no values")
            axes.append([f"{key}={v}" for v in vals])
        else:
            axes.append([f"{key}={o.get_value_element_as_str()}"])
    return [list(c) for c in itertools.product(*axes)]


def _slug(combo: Sequence[str], axes_keys: set[str]) -> str:
    parts = []
    for ov in combo:
        key, _, val = ov.partition("=")
        if key not in axes_keys:
            continue
        leaf = key.rsplit(".", 1)[-1].rsplit("/", 1)[-1]
        parts.append(f"{leaf}{val}")
    s = re.sub(r"[^a-z0-9_.-]+", "-", "-".join(parts).lower()).strip("-.")
    return s[:48] or "base"


def _swept_keys(combos: list[list[str]]) -> set[str]:
    """Keys whose value differs between combinations (the real axes)."""
    by_key: dict[str, set[str]] = {}
    for combo in combos:
        for ov in combo:
            k, _, v = ov.partition("=")
            by_key.setdefault(k, set()).add(v)
    return {k for k, vs in by_key.items() if len(vs) > 1}


def points_from_snakemake(smk_config: Mapping[str, Any], conf_dir: Path | None = None) -> list[Point]:
    """Every sweep point of this Snakemake invocation (one point when nothing is swept)."""
    smk = dict(smk_config)
    smk.pop(SERVED_KEY, None)  # read by the summary rule alone
    sweep = smk.pop(SWEEP_KEY, None)
    composed = smk.pop(COMPOSED_KEY, None)
    if composed is not None:
        if sweep or smk:
            raise ConfigError(
                f"composed={composed} is a complete config (DVC's params.yaml): it cannot be combined with "
                f"other --config entries {sorted(k for k in smk_config if k != COMPOSED_KEY)}; "
                "sweep with `dvc exp run -S key=a,b --queue` instead")
        path = Path(composed)
        if not path.is_absolute() and conf_dir is not None:
            path = Path(conf_dir).parent / path
        cfg = load_config_file(path)
        return [Point(cfg.experiment.name, (), cfg)]
    base = overrides_from_snakemake(smk)
    combos = parse_sweep(sweep)
    if len(combos) == 1:
        cfg = load_config([*base, *combos[0]], conf_dir)
        return [Point(cfg.experiment.name, tuple(combos[0]), cfg, tuple([*base, *combos[0]]))]
    keys = _swept_keys(combos)
    points: list[Point] = []
    seen: set[str] = set()
    for i, combo in enumerate(combos):
        first = load_config([*base, *combo], conf_dir)
        name = f"{first.experiment.name}.{_slug(combo, keys)}"
        if name in seen:
            name = f"{name}.{i}"
        seen.add(name)
        ovs = [*base, *combo, f"experiment.name={name}"]
        cfg = load_config(ovs, conf_dir)
        points.append(Point(name, tuple(o for o in combo if o.partition("=")[0] in keys), cfg, tuple(ovs)))
    _check_shared(points)
    return points


def _check_shared(points: list[Point]) -> None:
    """Points share the build side of the DAG; refuse sweeps that would need several."""
    from bakeoff.layout import backend_tag

    ref = points[0].cfg

    def build_key(c: Config) -> Any:
        tc = c.toolchain
        return (c.model, c.formats, tc, backend_tag(c.hardware) if tc else None,
                {e: c.engines[e].plugin for e in c.experiment.variants})

    for p in points[1:]:
        if build_key(p.cfg) != build_key(ref):
            raise ConfigError(
                f"sweep point {p.name!r} changes the model, formats, engine plugins or llama.cpp toolchain/backend: "
                "one DAG builds those once for all points; sweep them in separate invocations "
                "(or `dvc exp run --queue -S ...`)")


def _flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(d, dict):
        out: dict[str, Any] = {}
        for k, v in d.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: d}


def flatten(cfg: Config | Mapping[str, Any]) -> dict[str, Any]:
    """``{"engines.vllm.settings.dtype": "bfloat16", ...}``: every leaf value of the config."""
    data = cfg.model_dump(mode="json") if isinstance(cfg, Config) else dict(cfg)
    return _flatten(data)


def overrides_vs_default(cfg: Config, conf_dir: Path | None = None) -> list[str]:
    """Every leaf that differs from the experiment's own defaults, as ``key=value`` (sorted).

    The baseline is ``experiment=<the experiment file>``; the experiment name of
    a sweep point (``smoke.parallel32``) maps back to its file (``smoke``).
    """
    base_name = cfg.experiment.name.split(".", 1)[0]
    try:
        base = load_config([f"experiment={base_name}"], conf_dir)
    except ConfigError:
        return []  # a renamed experiment with no file of that name: nothing to diff against
    a, b = flatten(cfg), flatten(base)
    out = []
    for k in sorted(set(a) | set(b)):
        if k == "experiment.name":
            continue
        if a.get(k) != b.get(k):
            out.append(f"{k}={json.dumps(a.get(k), separators=(',', ':'))}")
    return out


def points_json(points: list[Point], conf_dir: Path | None = None) -> str:
    """Every point's axes, hash and full composed config, as JSON (``results/config.json``)."""
    return json.dumps({
        p.name: {
            "sweep": " ".join(p.sweep),
            "overrides": " ".join(overrides_vs_default(p.cfg, conf_dir)),
            "config_hash": p.hash,
            "hardware": p.cfg.hardware.model_dump(mode="json"),
            "engines": {e: p.cfg.engines[e].model_dump(mode="json") for e in p.cfg.experiment.variants},
            "config": p.cfg.model_dump(mode="json"),
        } for p in points
    }, sort_keys=True)


def points_command(a: argparse.Namespace) -> None:
    """``bakeoff points``: the invocation's sweep points (axes, hash, full config) -- results/config.json.

    Recomposed from Snakemake's ``--config`` entries by the same function the Snakefile uses, so the rule's
    params stay short (the entries plus hashes).
    """
    smk = json.loads(a.smk_config)
    if not isinstance(smk, dict):
        raise BakeoffError("--smk-config must be a JSON object (snakemake's --config entries)")
    conf = find_conf_dir()
    data = json.loads(points_json(points_from_snakemake(smk, conf_dir=conf), conf_dir=conf))
    atomic_write_text(Path(a.out), json.dumps(data, indent=2, sort_keys=True) + "\n")
