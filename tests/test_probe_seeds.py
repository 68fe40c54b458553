"""A capacity probe sends the same prompts at the same arrival times in every process.

Python salts ``hash()`` of a string per process (PYTHONHASHSEED); a seed derived from it would change the
search's requests from run to run. Two processes with different salts must agree exactly.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SNIPPET = """
import json, sys
from transformers import AutoTokenizer
from bakeoff.layout import probe_name
from bakeoff.loadgen.prompts import make_prompts
from bakeoff.loadgen.runner import arrival_gaps
from bakeoff.serving.capacity import probe_seed
tok = AutoTokenizer.from_pretrained(sys.argv[1])
name = probe_name("interactive", "rate", 2.5, 32)
seed = probe_seed(name, 20)
print(json.dumps({"seed": seed, "prompts": make_prompts(tok, 32, 20, seed=seed, tag=name + "-"),
                  "gaps": arrival_gaps(2.5, 20, seed), "salted": hash(name)}))
"""


def test_two_processes_with_different_hash_salts_build_the_same_probe(tmp_path: Path) -> None:
    from bakeoff.models.synthetic import write_hf_tokenizer

    write_hf_tokenizer(tmp_path, 512, 256)
    outs = []
    for salt in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": salt}
        done = subprocess.run([sys.executable, "-c", SNIPPET, str(tmp_path)], env=env, capture_output=True, text=True,
                              check=True, timeout=120)
        outs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    a, b = outs
    assert a["salted"] != b["salted"]  # the salts did differ, so a hash()-derived seed would too
    assert a["seed"] == b["seed"] and a["prompts"] == b["prompts"] and a["gaps"] == b["gaps"]
    assert len(set(a["prompts"])) == 20 and all(g > 0 for g in a["gaps"])
