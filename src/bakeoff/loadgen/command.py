"""``bakeoff load``: one load cell against any OpenAI-compatible server, with the pipeline's client and metrics.

Why: the same client and metric definitions as every cell of an experiment, for a server bakeoff did not
start (a comparison with another tool's client, a quick check of a running deployment).
"""

from __future__ import annotations

import argparse
import json
import sys

from bakeoff.errors import BakeoffError
from bakeoff.loadgen.cellload import CellLoad, ramp_extra
from bakeoff.loadgen.prompts import make_prompts
from bakeoff.loadgen.runner import run_cell, short_of_steady


def run_command(a: argparse.Namespace) -> None:
    from transformers import AutoTokenizer  # slow to import: only this command needs it

    if a.concurrency < 1:
        raise BakeoffError(f"--concurrency must be >= 1, got {a.concurrency}")
    if a.prompt_len < 4 or a.output_len < 1 or a.num_requests < 1:
        raise BakeoffError("--prompt-len must be >= 4, --output-len and --num-requests >= 1")
    if a.start == "ramp" and a.ramp_s is None and a.warmup < 1:
        raise BakeoffError("--start ramp without --ramp-s takes the ramp from the warm-up: give --warmup >= 1")
    tok = AutoTokenizer.from_pretrained(a.tokenizer or a.model)
    # A ramp's requests come on top of the measured ones (bakeoff.loadgen.cellload): --num-requests stay measured.
    extra = ramp_extra(a.start, a.concurrency, open_loop=a.request_rate is not None, sessions=False)
    prompts = make_prompts(tok, a.prompt_len, a.num_requests + extra + a.warmup, seed=a.seed)
    load = CellLoad(prompts[a.warmup:], prompt_len=a.prompt_len, output_len=a.output_len, concurrency=a.concurrency,
                    request_rate=a.request_rate, warmup_prompts=prompts[:a.warmup], seed=a.seed, start=a.start,
                    ramp_s=a.ramp_s)
    res = run_cell(a.url, a.model, load, api_key=a.api_key,
                   count_tokens=lambda t: len(tok.encode(t, add_special_tokens=False)), label="load")
    if short_of_steady(res, load):
        print(f"bakeoff load: the ramp drew all {extra} prompts of its supply: "
              f"{sum(not r.ramp for r in res.records)} of --num-requests {a.num_requests} were sent after it "
              "(a ramp of many request cycles; give a shorter --ramp-s)", file=sys.stderr)
    metrics = {**res.summary(), **res.client}
    if a.records:
        with open(a.records, "w") as f:
            for r in res.records:
                f.write(json.dumps(r.to_json()) + "\n")
    print(json.dumps(metrics, indent=2))
