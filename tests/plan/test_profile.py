"""The fake step (anatomy.plan.profile): what the loop keeps, the KV cache, linear combinations."""

from __future__ import annotations

from typing import Any

import torch

from anatomy.plan import Planner, PlanSettings
from anatomy.plan.profile import StepProfile, cache_tensors
from anatomy.plan.timeline import Category, PhasePeak


def test_cache_tensors_of_a_real_output(tiny_configs: dict[str, Any]) -> None:
    from transformers import AutoModelForCausalLM

    config = tiny_configs["llama"]
    model = AutoModelForCausalLM.from_config(config).train()
    ids = torch.randint(0, 100, (2, 8))
    out = model(input_ids=ids, labels=ids)
    found = cache_tensors(out)
    assert len(found) == 2 * config.num_hidden_layers
    assert {t.shape[-2] for t in found} == {8}
    assert cache_tensors({"logits": out.logits}) == []


def test_the_loop_keeps_the_cache(tiny_configs: dict[str, Any]) -> None:
    planner = Planner(tiny_configs["gpt2"], "causal-lm")
    kept = planner.profile(PlanSettings(batch_size=2, seq_len=16, target="cpu", padded=False))
    dropped = planner.profile(
        PlanSettings(batch_size=2, seq_len=16, target="cpu", padded=False, keep_outputs=False)
    )
    no_cache = planner.profile(
        PlanSettings(batch_size=2, seq_len=16, target="cpu", padded=False, use_cache=False)
    )
    config = planner.config
    logits = 2 * 16 * config.vocab_size * 4
    assert kept.kv_cache == config.n_layer * 2 * 2 * 16 * config.n_embd * 4
    # What `out` holds after backward: the logits and the cache (plus a few scalars: loss).
    assert logits + kept.kv_cache <= kept.kept_after_backward < logits + kept.kv_cache + 1024
    assert dropped.kept_after_backward < 1024 and dropped.kv_cache == kept.kv_cache
    assert no_cache.kv_cache == 0 and logits <= no_cache.kept_after_backward < logits + 1024


def test_combine_is_linear_field_by_field() -> None:
    def profile(n: int) -> StepProfile:
        peak = PhasePeak(10 * n, {c: n for c in Category})
        return StepProfile(
            activations=n,
            weight_copies=2 * n,
            forward=peak,
            backward=peak,
            kept_after_backward=3 * n,
            kv_cache=4 * n,
            params_in_run=5,
        )

    a, b = profile(1), profile(3)
    mid = a.scaled(b, 0.5)
    assert (mid.activations, mid.weight_copies, mid.kept_after_backward, mid.kv_cache) == (2, 4, 6, 8)
    assert mid.forward.bytes == 20 and all(v == 2 for v in mid.forward.by_category.values())
    assert mid.params_in_run == 5
    far = StepProfile.combine([(a, -1.0), (b, 2.0)])  # a + 2 (b - a)
    assert far.activations == 5 and far.backward.bytes == 50
