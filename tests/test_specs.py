"""Jobs get their config slice as a file: a failing job's command line stays short and its reason readable.

The dry run below is the real Snakefile planning the default experiment; the stage call is the real CLI.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from conftest import ROOT, SPEC_REF, bakeoff, results_root, snakemake


def test_every_stage_gets_its_spec_as_a_content_named_file(tmp_path: Path) -> None:
    root = results_root(tmp_path)
    out = snakemake("-n", "-p", "--forceall", "--cores", "1", "results/summary.csv", cwd=root).stdout
    commands = [line.split("Shell command: ", 1)[1] for line in out.splitlines()
                if line.startswith("Shell command: bakeoff stage")]
    assert commands, out[-2000:]
    for cmd in commands:
        assert "{" not in cmd, cmd  # no inline JSON on any stage's command line
        assert len(cmd) < 800, cmd
    refs = set(SPEC_REF.findall(out))
    assert any("serve" in c for c in commands) and refs
    for ref in refs:
        text = (root / ref).read_text()
        json.loads(text)
        assert Path(ref).stem == hashlib.sha256(text.encode()).hexdigest()[:20]
    serve = next(c for c in commands if "serve-load" in c and "vllm-fp16" in c)
    spec = json.loads((root / SPEC_REF.search(serve).group(1)).read_text())
    assert spec["engine_name"] == "vllm" and spec["engine"]["settings"]["dtype"] == "float32"


def test_a_missing_spec_file_is_named(tmp_path: Path) -> None:
    proc = bakeoff("stage", "doctor", "--spec", f"@{tmp_path}/gone.json", "--out", str(tmp_path / "hw.json"), cwd=ROOT)
    assert proc.returncode != 0
    assert f"--spec @{tmp_path}/gone.json: no such file" in proc.stderr
    assert not (tmp_path / "hw.json").exists()
