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


def compose_raw(overrides: Sequence[str] = (), conf_dir: Path | None = None) -> dict[str, Any]:
    """Hydra composition only: a plain, fully resolved dict."""
    conf_dir = Path(conf_dir) if conf_dir else find_conf_dir()
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


def load_config(overrides: Sequence[str] = (), conf_dir: Path | None = None) -> Config:
    """Compose and validate; the single entry point for every consumer."""
    raw = compose_raw(overrides, conf_dir)
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
        problems += [f"engines.{name}: {p}" for p in plugin.config_problems(engine, cfg.hardware)]
    return problems


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
