#!/bin/bash
# This session's GPU check: scripts/gpu_check, then the CUDA per-step benchmarks (base 4644c78 in .basesrc).
set -u
cd "$(dirname "$0")/../../.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH="$PWD:/tmp/site" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c "import sys,torch,transformers,bitsandbytes,textual; print(sys.version.split()[0], 'torch', torch.__version__, 'transformers', transformers.__version__, 'bnb', bitsandbytes.__version__, 'textual', textual.__version__, torch.cuda.get_device_name(0))"
  nproc; } > "$O/versions.txt" 2>&1
run() { local name=$1 limit=$2; shift 2; local t0=$SECONDS
  timeout "$limit" "$@" > "$O/$name.txt" 2>&1; echo "[$name rc $? in $((SECONDS - t0)) s]" | tee -a "$O/$name.txt"; }
run gpu_check 100 scripts/gpu_check
tail -2 "$O/gpu_check.txt"
run versions_cuda_mlp ${VLIMIT:-170} python3 benchmarks/bench_hook_versions.py --base-dir .basesrc --device cuda --models mlp --depths ${VDEPTHS:-2,8} --rounds ${VROUNDS:-1000} --floor
grep -E "on cuda|this|plain|floor" "$O/versions_cuda_mlp.txt"
run sweep_cuda ${SLIMIT:-120} python3 benchmarks/bench_hook_sweep.py --device cuda --cpu 15 --loops plain --only mlp --depths 2,8 --widths "" --budget ${SBUDGET:-10}
grep -A4 "^| loop" "$O/sweep_cuda.txt"
run profile_cuda_lean 40 python3 benchmarks/profile_cuda_lean.py --steps 300
head -40 "$O/profile_cuda_lean.txt"
