#!/bin/bash
# Rebuilds this folder's summary.csv and report.html from node-results.tgz, the way the summary and pages
# rules do, in a scratch directory. The lease ended 100 s into f16's block-2 job (its last, serve_load), so
# f16 has no cells.json: its index here is f16-partial.json, every f16 cell the node finished (blocks 0-1,
# and block 2's c=1 and c=8), made by the lines below from the cell files, nothing typed by hand.
#   bash runs/h200-llamacpp-blocks-2026-12-04/make-summary.sh      (from the repository root, after make setup)
set -euo pipefail
R=$(cd "$(dirname "$0")" && pwd); ROOT=$(pwd); W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
B="$ROOT/.venv/bin"
"$B/bakeoff" node unpack "$R/node-results.tgz" --repo "$W" > /dev/null
cd "$W"
V=results/raw/h200_blocks/llama2-7b-synthetic
"$B/python" - "$V" <<'PY'
import json, sys
from pathlib import Path
v = Path(sys.argv[1]) / "llamacpp-f16"
blocks = [json.loads((v / f"block-{b}.json").read_text()) for b in (0, 1)]
names = ["c1-p128-r2", "c8-p128-r2"]  # block 2's finished cells
cells = [c for b in blocks for c in b["cells"]] + [json.loads((v / f"{n}.json").read_text()) for n in names]
(v / "f16-partial.json").write_text(json.dumps({"variant": blocks[0]["variant"], "cells": cells}, indent=2))
PY
(cd "$ROOT" && "$B/bakeoff" points --smk-config '{"experiment": "h200_blocks"}' --out "$W/results/config.json")
"$B/bakeoff" summary $V/llamacpp-f16/f16-partial.json $V/llamacpp-q8_0/cells.json $V/llamacpp-q4_k_m/cells.json \
  $V/llamacpp_cacheram-q4_k_m/cells.json --points results/config.json --published "$ROOT/data/published_numbers.yaml" \
  --hardware results/hardware.json --kernel results/kernel/llama2-7b-synthetic/*.json --out "$R/summary.csv"
echo '{}' > versions.json
"$B/bakeoff" pages --summary "$R/summary.csv" --versions versions.json --config results/config.json \
  --hardware-json results/hardware.json --summary-html "$R/report.html" --environment-html "$W/environment.html"
