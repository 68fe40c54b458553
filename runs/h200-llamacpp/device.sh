#!/bin/bash
# One call on the lent H200: doctor probe -> CUDA build (arch 90) -> synthetic Llama-2-7B-shape F16 GGUF
# -> Q4_0 -> llama-bench pp512/tg128 (flash attention off, the scoreboard's setting). Everything lands in $OUT
# as soon as it exists, so a timeout still returns what finished.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
T0=$(date +%s); t() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/timeline.txt; }
t start
mkdir -p /tmp/l && tar xzf .gpucarry/llama-src.tgz -C /tmp/l
export PYTHONPATH=$PWD/src:/tmp/l/llama.cpp/gguf-py
python3 -m bakeoff.doctor $OUT/h200-probe.json 2> $OUT/probe.err; t probe rc=$?
nvidia-smi > $OUT/nvidia-smi.txt 2>&1; nvidia-smi topo -m >> $OUT/nvidia-smi.txt 2>&1
(python3 -m bakeoff.synthetic --out /tmp/m --name llama2-7b-synthetic > $OUT/synthetic.log 2>&1; echo "synthetic rc=$? at $(( $(date +%s) - T0 ))s" >> $OUT/synthetic.log) &
SYN=$!
cmake -S /tmp/l/llama.cpp -B /tmp/b -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90-real \
  -DGGML_CUDA_FA=OFF -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_SERVER=OFF -DBUILD_SHARED_LIBS=OFF > $OUT/build.log 2>&1; t cmake rc=$?
cmake --build /tmp/b -j 16 --target llama-bench llama-quantize >> $OUT/build.log 2>&1; t build rc=$?
wait $SYN; t synthetic $(tail -1 $OUT/synthetic.log)
/tmp/b/bin/llama-quantize /tmp/m/model.gguf /tmp/q4_0.gguf Q4_0 16 > $OUT/quantize.log 2>&1; t quantize rc=$?
/tmp/b/bin/llama-bench -m /tmp/q4_0.gguf -p 512 -n 128 -fa 0 -r 3 -o json > $OUT/llama-bench-q4_0-fa0.json 2> $OUT/llama-bench.err; t bench rc=$?
tail -c 3000 $OUT/build.log
