"""What ``bakeoff stage <name>`` hands a DAG rule's module: its paths and its slice of the config, typed.

Why a type: every rule's module reads the same few inputs (``--input``, ``--out``, a JSON config slice, the
hardware config), so the command line is parsed once (bakeoff.cli) and each rule takes what it needs from one
object, with the config slices validated by the schema where the rule reads them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel

from bakeoff.config.schema import HardwareCfg
from bakeoff.errors import BakeoffError
from bakeoff.layout import MANIFEST

M = TypeVar("M", bound=BaseModel)


def artifact_dir(p: str | Path) -> Path:
    """An artifact named by its manifest path or by its directory: the directory, which stages work on."""
    path = Path(p)
    return path.parent if path.name == MANIFEST else path


def json_arg(value: str | None, flag: str) -> str | None:
    """``--spec``/``--hardware`` take JSON, or ``@path`` of a file holding it (what the Snakefile passes)."""
    if value is None or not value.startswith("@"):
        return value
    path = Path(value[1:])
    if not path.is_file():
        raise BakeoffError(f"{flag} {value}: no such file (a job's config slice is written when the DAG is planned)")
    return path.read_text()


@dataclass(frozen=True)
class StageArgs:
    """One rule's inputs; paths as given (a manifest or its directory), config slices as JSON text."""

    out: str
    input: str | None = None
    spec: str | None = None
    hardware: str | None = None
    tree: str | None = None
    toolchain: str | None = None
    eval_toolchain: str | None = None
    tokenizer: str | None = None
    format: str | None = None
    watch_pid: int | None = None
    jobs: int | None = None
    flash_attn: str = "auto"

    @property
    def out_dir(self) -> Path:
        return artifact_dir(self.out)

    def dir(self, name: str) -> Path:
        """The artifact directory of the path argument ``name`` (input, tree, toolchain, ...); it must be given."""
        value = getattr(self, name)
        if value is None:
            raise BakeoffError(f"this stage needs --{name.replace('_', '-')}")
        return artifact_dir(value)

    def spec_as(self, model: type[M]) -> M:
        """``--spec`` validated as ``model`` (the stage's config slice)."""
        return model.model_validate_json(self.spec or "{}")

    def spec_json(self) -> dict[str, Any]:
        return json.loads(self.spec or "{}")

    def hardware_cfg(self) -> HardwareCfg:
        if self.hardware is None:
            raise BakeoffError("this stage needs --hardware (the hardware config as JSON)")
        return HardwareCfg.model_validate_json(self.hardware)
