#!/bin/bash
# The first GPU call since 89bcefb: the CUDA step timed on the device every tenth of the publish interval and
# resting between (3481666, 85f90b7), under gradient accumulation (db48fab, 375e0ca) and bitsandbytes (26420e8).
# Base 89bcefb in .basesrc (`git archive 89bcefb anatomy | tar -x -C .basesrc`); wheels in .whl.
set -u
cd "$(dirname "$0")/../../.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH="$PWD:/tmp/site" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c "import sys,torch,transformers,bitsandbytes,textual; print(sys.version.split()[0], 'torch', torch.__version__, 'transformers', transformers.__version__, 'bnb', bitsandbytes.__version__, 'textual', textual.__version__, torch.cuda.get_device_name(0))"
  nproc; git log -1 --format=%H 2>/dev/null; } > "$O/versions.txt" 2>&1
run() { local name=$1 limit=$2; shift 2; local t0=$SECONDS
  timeout "$limit" "$@" > "$O/$name.txt" 2>&1; echo "[$name rc $? in $((SECONDS - t0)) s]" | tee -a "$O/$name.txt"; }
V="python3 benchmarks/bench_hook_versions.py --base-dir .basesrc --device cuda --models mlp --floor --told"
run gpu_check 80 scripts/gpu_check
tail -2 "$O/gpu_check.txt"
run versions_cuda_told 135 $V --depths 2,8 --rounds 700
grep -E "on cuda|this|plain|floor" "$O/versions_cuda_told.txt"
run sweep_cuda 85 python3 benchmarks/bench_hook_sweep.py --device cuda --cpu 15 --loops plain --only mlp --depths 2,8 --widths "" --budget 8
grep -A4 "^| loop" "$O/sweep_cuda.txt"
# four micro-batches a step, a step block each: none rested before db48fab, none was lean on CUDA before 375e0ca
run versions_cuda_accumulate 75 $V --depths 2 --rounds 400 --accumulate 4
grep -E "on cuda|this|plain|floor" "$O/versions_cuda_accumulate.txt"
# torch's fused AdamW (the Trainer's default on GPUs): no step of it rested before e3ef9e6
run versions_cuda_fused 65 $V --depths 2 --rounds 400 --fused
grep -E "on cuda|this|plain|floor" "$O/versions_cuda_fused.txt"
# bitsandbytes' AdamW8bit (its step count a Python int): no step of it rested before 26420e8
run versions_cuda_bnb 60 $V --depths 2 --rounds 400 --bnb
grep -E "on cuda|this|plain|floor" "$O/versions_cuda_bnb.txt"
run profile_cuda_lean_told 40 python3 benchmarks/profile_cuda_lean.py --steps 300 --told
head -30 "$O/profile_cuda_lean_told.txt"
