"""Record a's quality code under the GPU node's library versions, checked on this CPU before a node is held.

Why: the node route carries lm-eval and compressed-tensors (bakeoff node pack --quality) at this venv's
versions, but the node's own transformers, huggingface-hub, tokenizers and safetensors come first there
(workflow/node-packages.txt). This puts those exact versions first on the path and runs what record a runs
with them: lm-eval's scoring of bakeoff's offline tasks against llama.cpp's scorer (bakeoff.quality.gguf_server
on a GGUF from `make run`), and quantize_fp8 on the embedded model's fp16 checkpoint. torch stays this venv's
(the node's CUDA 2.11 build is not installable here), so that part of the node is not covered.

    .venv/bin/pip install --no-deps --target /tmp/nodecompat transformers==5.17.0 huggingface-hub==1.33.0 \
        tokenizers==0.23.2 safetensors==0.8.0
    PYTHONPATH=/tmp/nodecompat:src .venv/bin/python benchmarks/quality_on_node_versions.py \
        models/smollm2-135m/q8_0/model.gguf
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    import compressed_tensors
    import huggingface_hub
    import lm_eval
    import requests
    import transformers

    from bakeoff.quality.lmeval import evaluate
    from bakeoff.stages.quantize_fp8 import quantize

    print(f"transformers {transformers.__version__} ({transformers.__file__}), huggingface-hub "
          f"{huggingface_hub.__version__}, lm-eval {lm_eval.__version__}, compressed-tensors "
          f"{compressed_tensors.__version__}", flush=True)
    gguf, fp16 = Path(sys.argv[1]), ROOT / "models/smollm2-135m/fp16"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    binding = sorted((ROOT / "build/llamacpp-python").glob("*/site"))[0]
    lib = sorted((ROOT / "build/llamacpp").glob("*-cpu/lib"))[0]
    env = {**os.environ, "PYTHONPATH": f"{binding}:{ROOT / 'src'}", "LLAMA_CPP_LIB_PATH": str(lib.resolve())}
    srv = subprocess.Popen([sys.executable, "-m", "bakeoff.quality.gguf_server", "--model", str(gguf),
                            "--port", str(port)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(120):
            try:
                requests.get(f"http://127.0.0.1:{port}/v1/models", timeout=1)
                break
            except requests.ConnectionError:
                time.sleep(1)
        scores = evaluate(f"http://127.0.0.1:{port}", "model", fp16, ["pydoc_ppl", "pydoc_mc"], limit=4,
                          max_length=2048, num_concurrent=2)
    finally:
        srv.terminate()
        srv.wait(10)
    print("lm-eval:", scores, flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "fp8"
        quantize(fp16, out)
        print("quantize_fp8:", sorted(p.name for p in out.iterdir()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
