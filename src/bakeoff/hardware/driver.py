"""The NVIDIA driver against the CUDA toolkit the llama.cpp build will use.

Why: the CUDA build takes up to half an hour, and a toolkit newer than the
driver supports builds fine and then fails when the first kernel runs. The
toolkit is the one pinned by the hardware config's conda environment
(``HardwareCfg.toolchain_env``, e.g. ``envs/llamacpp-cuda.yaml``: the
``nvidia/label/cuda-X.Y.Z`` channel); its minimum driver comes from NVIDIA's
release-notes table, kept with its source in ``data/cuda_driver_minimums.yaml``.
The doctor refuses a mismatch before any build, naming both versions and the
two fixes: an older toolkit, or a newer driver.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[3]  # the checkout: envs/ and data/
ENVS_DIR = REPO / "envs"
TABLE_PATH = REPO / "data" / "cuda_driver_minimums.yaml"
_LABEL = re.compile(r"(?:^|/)cuda-(\d+)\.(\d+)(?:\.(\d+))?$")


def version_key(version: str) -> tuple[int, ...]:
    """``"535.104.05"`` -> ``(535, 104, 5)``: compares as NVIDIA numbers drivers."""
    return tuple(int(p) for p in re.findall(r"\d+", str(version)))


def load_table(path: Path = TABLE_PATH) -> dict[str, Any]:
    import yaml

    return yaml.safe_load(Path(path).read_text())


def toolkit_of_env(env_file: Path) -> str | None:
    """The CUDA release an environment pins (``major.minor.update``), from its ``nvidia/label/cuda-X.Y.Z`` channel."""
    import yaml

    env = yaml.safe_load(Path(env_file).read_text()) or {}
    for channel in env.get("channels") or []:
        m = _LABEL.search(str(channel))
        if m:
            return f"{m.group(1)}.{m.group(2)}.{m.group(3) or 0}"
    return None


def newest_toolkit_for(driver: str, table: dict[str, str]) -> str | None:
    """The newest release in the table whose minimum this driver meets."""
    fits = [r for r, d in table.items() if version_key(driver) >= version_key(d)]
    return max(fits, key=version_key) if fits else None


def check(driver: str | None, env_name: str, envs_dir: Path = ENVS_DIR,
          table_path: Path = TABLE_PATH) -> dict[str, Any]:
    """The driver check's record: ``ok`` is False (with ``message``) when the driver is older than the toolkit needs.

    ``ok`` is None when there is nothing to compare (no driver: NVML unavailable; an environment without a
    CUDA channel; a release missing from the table, which ``message`` names).
    """
    data = load_table(table_path)
    table = {str(k): str(v) for k, v in data["minimum_driver"].items()}
    if not (envs_dir / env_name).is_file():
        return {"env": f"envs/{env_name}", "cuda_toolkit": None, "driver": driver, "min_driver": None,
                "source": data.get("source"), "ok": None,
                "message": f"hardware.llamacpp_env names envs/{env_name}, which does not exist"}
    release = toolkit_of_env(envs_dir / env_name)
    rec: dict[str, Any] = {"env": f"envs/{env_name}", "cuda_toolkit": release, "driver": driver,
                           "min_driver": table.get(release or ""), "source": data.get("source"), "ok": None,
                           "message": ""}
    if release is None or driver is None:
        return rec
    if release not in table:
        rec["message"] = (f"CUDA {release} (envs/{env_name}) is not in {table_path.name}; add its minimum driver "
                          f"from {data.get('source')}")
        return rec
    need = table[release]
    rec["ok"] = version_key(driver) >= version_key(need)
    if not rec["ok"]:
        fits = newest_toolkit_for(driver, table)
        older = (f"a toolkit this driver supports (CUDA <= {fits}: an envs/ file pinning the nvidia/label/cuda-{fits} "
                 "channel, named by hardware.llamacpp_env)" if fits else "an older toolkit")
        rec["message"] = (f"NVIDIA driver {driver} is older than {need}, the minimum of CUDA {release} that "
                          f"envs/{env_name} pins (NVIDIA's table: {data.get('source')}). Fix: build with {older}, "
                          f"or install driver >= {need}.")
    return rec
