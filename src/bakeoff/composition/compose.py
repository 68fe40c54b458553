"""Compose bakeoff's Hydra config, validate it against the typed schema, then ask each engine.

Why one function: the Snakefile, the CLI and the tests must all see exactly the
same config for the same overrides. Hydra composes ``conf/``; pydantic checks
the result; then each configured engine checks its own settings (its plugin
exists, a prompt fits its context, the hardware suits it). Every kind of
failure becomes a ``ConfigError`` naming the key.

Why the engine checks live here and not in the schema: the engines read the
schema's types, so a schema that asked the engines would import its own
readers. Composition sits above both (tests/test_layers.py).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import HydraException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException
from pydantic import ValidationError

from bakeoff.config.schema import Config
from bakeoff.errors import BakeoffError, ConfigError


def find_conf_dir(start: Path | None = None) -> Path:
    """The ``conf/`` next to the nearest enclosing ``Snakefile`` (the project root)."""
    here = (start or Path.cwd()).resolve()
    for d in (here, *here.parents):
        if (d / "conf" / "config.yaml").is_file():
            return d / "conf"
    raise ConfigError(f"no conf/config.yaml found in {here} or its parents")


def _hydra_value(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_hydra_value(v) for v in value) + "]"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def overrides_from_snakemake(config: Mapping[str, Any]) -> list[str]:
    """Turn ``snakemake --config ...`` entries back into Hydra overrides.

    Snakemake accepts only identifiers as keys, so dotted Hydra paths travel in
    one entry, ``overrides``, split like a shell line::

        --config experiment=blog_v100 overrides="load.concurrency=[1,8] engines.llamacpp.settings.parallel=32"

    Other entries are plain ``key=value`` overrides (Snakemake has already
    parsed their values, e.g. ``[1,8]`` into a list; Hydra wants text).
    """
    out = []
    for key, value in config.items():
        if key == "overrides":
            items = value if isinstance(value, (list, tuple)) else shlex.split(str(value))
            out.extend(str(v) for v in items)
        else:
            out.append(f"{key}={_hydra_value(value)}")
    return out


TEMPLATE = "_template"  # conf/hardware/_template.yaml: every hardware field, never selected by name
AUTO = "auto"  # hardware=auto: the config is picked or composed from the node's GPUs (bakeoff.hardware.match)


def hardware_configs(conf_dir: Path) -> dict[str, dict[str, Any]]:
    """Every selectable ``conf/hardware/<name>.yaml`` (``_template`` left out), by name."""
    import yaml

    out = {}
    for p in sorted((conf_dir / "hardware").glob("*.yaml")):
        if p.stem != TEMPLATE:
            out[p.stem] = yaml.safe_load(p.read_text())
    return out


def node_facts(root: Path) -> dict[str, Any]:
    """What ``hardware=auto`` reads: the doctor's record of this checkout (``results/hardware.json``) where
    there is one (on the submit host, the node's, unpacked), else NVML now (the doctor's own probe)."""
    from bakeoff.hardware.doctor import probe_gpus
    from bakeoff.layout import HARDWARE

    record = root / HARDWARE
    if record.is_file():
        try:
            return json.loads(record.read_text())
        except json.JSONDecodeError as e:
            raise ConfigError(f"hardware=auto: the doctor's record {record} is not JSON ({e}); delete it") from None
    return probe_gpus(measure_bandwidth=False)


def _quoted(value: Any) -> str:
    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return _hydra_value(value)


def resolve_auto(overrides: Sequence[str], conf_dir: Path, facts: Mapping[str, Any] | None = None) -> list[str]:
    """``overrides`` with ``hardware=auto`` replaced by the config that fits the node (``facts``: the
    doctor's findings; None: :func:`node_facts`).

    A fitting ``conf/hardware/`` config is selected by name; where none fits, one composed from the
    findings (bakeoff.hardware.match.compose) is set key by key over ``hardware=_template`` (which names
    every field, so every key is replaced), ahead of the other
    overrides, so a ``hardware.<key>=`` given beside ``hardware=auto`` still wins.
    """
    from bakeoff.hardware.match import choose

    if f"hardware={AUTO}" not in overrides:
        return list(overrides)
    facts = facts if facts is not None else node_facts(conf_dir.parent)
    try:
        name, made = choose(facts, hardware_configs(conf_dir))
    except ValueError as e:
        raise ConfigError(str(e)) from None
    rest = [o for o in overrides if o != f"hardware={AUTO}"]
    if made is None:
        return [*rest, f"hardware={name}"]
    return [f"hardware={TEMPLATE}", *(f"hardware.{k}={_quoted(v)}" for k, v in made.items()), *rest]


def compose_raw(overrides: Sequence[str] = (), conf_dir: Path | None = None,
                facts: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Hydra composition only: a plain, fully resolved dict (``facts``: the node's, for ``hardware=auto``)."""
    conf_dir = Path(conf_dir) if conf_dir else find_conf_dir()
    overrides = resolve_auto(overrides, conf_dir, facts)
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(conf_dir.resolve()), version_base="1.3"):
            cfg = compose(config_name="config", overrides=list(overrides))
        raw = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    except (HydraException, OmegaConfBaseException) as e:
        raise ConfigError(f"cannot compose config with overrides {list(overrides)}: {e}") from None
    finally:
        GlobalHydra.instance().clear()
    assert isinstance(raw, dict)
    return raw


def _format_validation(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "<root>"
        msg = e["msg"].removeprefix("Value error, ")
        got = e.get("input")
        shown = "" if isinstance(got, dict) else f" (got {got!r})"
        lines.append(f"  {loc}: {msg}{shown}")
    return "invalid config:\n" + "\n".join(lines)


def load_config(overrides: Sequence[str] = (), conf_dir: Path | None = None,
                facts: Mapping[str, Any] | None = None) -> Config:
    """Compose and validate; the single entry point for every consumer (``facts``: see :func:`resolve_auto`)."""
    raw = compose_raw(overrides, conf_dir, facts)
    try:
        cfg = Config.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(_format_validation(e)) from None
    return check_engines(cfg)


def engine_problems(cfg: Config) -> list[str]:
    """What the engines themselves find wrong with a validated config, each naming its key.

    Every configured engine (and its ``eval_server``) must name a registered plugin; each engine that
    serves a variant must fit the longest prompt plus the output in one request's context, and passes its
    own settings-against-hardware checks (``Engine.config_problems``).
    """
    from bakeoff.engines import get_engine

    problems: list[str] = []
    for name, engine in cfg.engines.items():
        for key, e in ((f"engines.{name}", engine), (f"engines.{name}.eval_server", engine.eval_server)):
            if e is None:
                continue
            try:
                get_engine(e.plugin)
            except BakeoffError as err:
                problems.append(f"{key}.plugin: {err}")
    if problems:
        return problems
    need = max(cfg.load.prompt_len) + cfg.load.output_len
    for name in cfg.experiment.variants:
        engine = cfg.engines[name]
        plugin = get_engine(engine.plugin)
        ctx = plugin.request_context(engine.settings, cfg.model.max_context)
        if need > ctx:
            problems.append(f"load.prompt_len {max(cfg.load.prompt_len)} + load.output_len {cfg.load.output_len} = "
                            f"{need} tokens exceeds engine {name!r}'s per-request context of {ctx} tokens")
        if cfg.load.workload.kind != "fixed":
            from bakeoff.loadgen.workload import longest_request

            longest, what = longest_request(cfg.load)
            if longest > ctx:
                problems.append(f"load.workload {cfg.load.workload.kind}: {what} needs {longest} tokens, over engine "
                                f"{name!r}'s per-request context of {ctx} tokens")
        problems += [f"engines.{name}: {p}" for p in plugin.config_problems(engine, cfg.hardware)]
    return problems


def run_problems(cfg: Config, *, conda: bool = False) -> list[str]:
    """What on this machine stops a real run of ``cfg`` (``Engine.run_problems`` of each engine that serves a
    variant), each naming its engine. The workflow asks before its first job; a plan (``-n``) never asks."""
    from bakeoff.engines import get_engine

    return [f"engines.{name}: {p}" for name in cfg.experiment.variants
            for p in get_engine(cfg.engines[name].plugin).run_problems(cfg.engines[name], cfg.hardware, conda=conda)]


def check_engines(cfg: Config) -> Config:
    """The config, once its engines find nothing wrong with it (:func:`engine_problems`)."""
    if problems := engine_problems(cfg):
        raise ConfigError("invalid config:\n" + "\n".join(f"  {p}" for p in problems))
    return cfg


def config_hash(cfg: Config) -> str:
    """Short, stable hash of the resolved config (recorded with every result).

    Left out: site-local settings, and how the answer reads the numbers (``answer``): neither changes what is
    measured, so neither makes the serving jobs stale.
    """
    blob = json.dumps(cfg.model_dump(mode="json", exclude={"site", "answer"}), sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def load_config_file(path: Path) -> Config:
    """Validate a pre-composed config (DVC's Hydra-composed ``params.yaml``) with the same schema.

    Why: ``dvc exp run -S key=value`` composes ``conf/`` itself and writes the
    result to ``params.yaml``; the pipeline must run exactly that config, not
    re-compose its own. Validation is the same pydantic schema as
    :func:`load_config`, so a bad ``-S`` value fails the same way.
    """
    import yaml

    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"composed config {p} does not exist (run `dvc exp run`, or drop composed=)")
    try:
        raw = yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(f"composed config {p} is not valid YAML: {e}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"composed config {p} must be a mapping, got {type(raw).__name__}")
    try:
        cfg = Config.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(f"{p}: {_format_validation(e)}") from None
    return check_engines(cfg)


def config_command(a: argparse.Namespace) -> None:
    """``bakeoff config [overrides]``: the composed, validated config and its hash, as JSON."""
    cfg = load_config(a.overrides)
    print(json.dumps({"config_hash": config_hash(cfg), **cfg.model_dump(mode="json")}, indent=2))


def dvc_params_command(a: argparse.Namespace) -> None:
    """``bakeoff dvc-params``: params.yaml re-composed exactly as `dvc exp run` does (DVC's own composer), for
    `dvc repro`, and validated by the same schema."""
    from dvc.utils.hydra import compose_and_dump  # DVC's import is slow: only this command needs it

    conf = find_conf_dir()
    compose_and_dump(Path(a.out), str(conf), None, "config", str(conf.parent), list(a.overrides))
    load_config_file(Path(a.out))
    print(f"wrote {a.out}")
