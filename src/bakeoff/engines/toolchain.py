"""The built llama.cpp tools and binding, looked up and checked before a server or stage uses them.

Why here: engines start these binaries, and stages (quantize, llama-bench)
run them too; both ask this module, which checks each build's manifest, while
``bakeoff.layout`` alone says where the files are.
"""

from __future__ import annotations

from pathlib import Path

from bakeoff.errors import ToolchainError
from bakeoff.layout import LIBLLAMA, tool_path
from bakeoff.models.manifest import read_manifest, sha256_file


def toolchain_bin(toolchain_dir: Path, tool: str) -> Path:
    """Path of a built tool, after checking the build's manifest."""
    read_manifest(toolchain_dir)
    path = tool_path(toolchain_dir, tool)
    if not path.is_file():
        raise ToolchainError(f"{tool} is not in toolchain {toolchain_dir}")
    return path


def library_dir(binding_dir: Path) -> Path:
    """The toolchain ``lib/`` a llama-cpp-python binding loads, checked against the sha256 recorded at install time."""
    m = read_manifest(binding_dir)
    lib_dir = (Path(binding_dir) / m["lib_dir"]).resolve()
    lib = lib_dir / Path(LIBLLAMA).name
    if not lib.is_file():
        raise ToolchainError(f"{binding_dir} loads {lib}, which is missing: rebuild the toolchain")
    if sha256_file(lib) != m["libllama_sha256"]:
        raise ToolchainError(f"{lib} is not the libllama {binding_dir} was installed against (sha256 differs)")
    return lib_dir
