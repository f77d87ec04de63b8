#!/bin/bash
# This session's second GPU call: the CUDA step timed on the device every tenth of the publish interval and
# resting between (base 89bcefb, this session's start, in .basesrc); steps told their samples (they may rest).
set -u
cd "$(dirname "$0")/../../.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH="$PWD:/tmp/site" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
run() { local name=$1 limit=$2; shift 2; local t0=$SECONDS
  timeout "$limit" "$@" > "$O/$name.txt" 2>&1; echo "[$name rc $? in $((SECONDS - t0)) s]" | tee -a "$O/$name.txt"; }
run gpu_check_after 100 scripts/gpu_check
tail -2 "$O/gpu_check_after.txt"
run versions_cuda_mlp_told 175 python3 benchmarks/bench_hook_versions.py --base-dir .basesrc --device cuda --models mlp --depths 2,8 --rounds 1000 --floor --told
grep -E "on cuda|this|plain|floor" "$O/versions_cuda_mlp_told.txt"
# torch's fused AdamW (fused=True, common on GPUs; the Trainer's default): no step of it rested before e3ef9e6
run versions_cuda_fused_told 90 python3 benchmarks/bench_hook_versions.py --base-dir .basesrc --device cuda --models mlp --depths 2 --rounds 600 --floor --told --fused
grep -E "on cuda|this|plain|floor" "$O/versions_cuda_fused_told.txt"
# four micro-batches a step, a step block each (accumulation): no such step rested before db48fab (and on CUDA
# none was lean before 375e0ca)
run versions_cuda_accumulate 60 python3 benchmarks/bench_hook_versions.py --base-dir .basesrc --device cuda --models mlp --depths 2 --rounds 600 --floor --told --accumulate 4
grep -E "on cuda|this|plain|floor" "$O/versions_cuda_accumulate.txt"
run sweep_cuda_after 100 python3 benchmarks/bench_hook_sweep.py --device cuda --cpu 15 --loops plain --only mlp --depths 2,8 --widths "" --budget 10
grep -A4 "^| loop" "$O/sweep_cuda_after.txt"
run profile_cuda_lean_told 45 python3 benchmarks/profile_cuda_lean.py --steps 300 --told
head -40 "$O/profile_cuda_lean_told.txt"
