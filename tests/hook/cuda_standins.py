"""What the tests' stand-ins for the CUDA caching allocator answer: the nested statistics the hook reads
(``torch.cuda.memory_stats_as_nested_dict``), with the counters it uses and nothing else."""

from __future__ import annotations

from typing import Any


def nested_stats(allocated: int, peak: int, reserved: int, retries: int = 0, ooms: int = 0) -> dict[str, Any]:
    return {
        "allocated_bytes": {"all": {"current": allocated, "peak": peak}},
        "reserved_bytes": {"all": {"current": reserved}},
        "num_alloc_retries": retries,
        "num_ooms": ooms,
    }
