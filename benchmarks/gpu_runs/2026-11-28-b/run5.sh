#!/bin/bash
# For the next lent machine: scripts/gpu_check with its resting runs (db27bcf, never yet on a GPU), then run4.sh
# (which ran out of time before its first figures) with limits that fit; the Llama run left out (~530 s in all)
set -u
cd "$(dirname "$0")/../../.."
source benchmarks/gpu_runs/device_env.sh
run gpu_check 110 scripts/gpu_check
grep -E "resting|accumulate|passed" "$O/gpu_check.txt"
V="python3 benchmarks/bench_hook_versions.py --base-dir .basesrc --device cuda --floor --told --depths 2"
run versions_cuda_bnb 100 $V --models mlp --rounds 400 --bnb
grep -E "on cuda|this|plain|floor" "$O/versions_cuda_bnb.txt"
run versions_cuda_trainer_accumulate 130 $V --models trainer --rounds 200 --accumulate 4
grep -E "on cuda|this|plain|floor|Error" "$O/versions_cuda_trainer_accumulate.txt"
run versions_cuda_lightning_accumulate 130 $V --models lightning --rounds 200 --accumulate 4
grep -E "on cuda|this|plain|floor|Error" "$O/versions_cuda_lightning_accumulate.txt"
# where the first steps go on CUDA (the sweep there: step 0 held 9.11 usual steps, step 1 +7.0 ms), against the
# hook before the set-up took the first steps' once-per-process work (.basefirst: git archive 1e8eb2f anatomy)
run profile_first_steps 100 python3 benchmarks/profile_first_steps.py --device cuda --rounds 3 --steps 6 --no-profile \
    --base-dir .basefirst
head -80 "$O/profile_first_steps.txt"
