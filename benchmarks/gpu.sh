#!/usr/bin/env bash
# The GPU path in one go, for a machine with a CUDA device and torch/transformers/peft already installed:
# the CUDA-marked tests on tiny-random, training throughput and FLOP utilisation of TokMem vs LoRA on a
# random-weights model of Llama-3.2-1B's shape (bf16), and the serving engine's decode throughput on it.
#   bash benchmarks/gpu.sh OUT_DIR
set -uo pipefail
out=${1:?usage: benchmarks/gpu.sh OUT_DIR}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1 || echo "pip install -e . failed"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv | tee "$out/gpu.txt"
python3 -m pytest -q -m cuda tests/test_cuda.py 2>&1 | tee "$out/cuda-tests.log"
train() {  # TokMem's batch; the JSON is named after it (LoRA at its best of 32, 64, 128)
  python3 benchmarks/train_throughput.py --backbone random:llama-3.2-1b --device cuda --workload demo --examples 256 \
    --batch-size "$1" --lora-batches 32,64,128 --json "$out/train_throughput_gpu-b$1.json" 2>&1 | grep -v Warning
}
train 32
train 128
python3 benchmarks/serve_mixed_banks.py --backbone random:llama-3.2-1b --device cuda --batch 64 --tokens 32 \
  --waves 2 --no-http --json "$out/serve_decode_gpu.json" 2>&1 | grep -v Warning
