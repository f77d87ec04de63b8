"""``scripts/gpu_check``: the hook and the monitor checked on a real GPU, each figure against an independent
count made in the same process.

``verdicts`` holds the comparisons (pure functions of numbers, unit-tested without a GPU), ``probe`` says
whether there is a CUDA device at all, ``workloads`` trains the small models on ``cuda:0`` and gathers the
numbers, ``cli`` runs it all and prints the verdict table. Nothing here is imported by the hook.
"""
