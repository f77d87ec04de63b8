"""Model states from shapes (anatomy.plan.states) against real optimizers' state tensors."""

from __future__ import annotations

import math

import pytest
import torch

from anatomy.plan import Planner, PlanSettings
from anatomy.plan.settings import Target
from anatomy.plan.states import ParamShape, allocation_bytes, optimizer_state_bytes


def _real_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    seen: dict[int, int] = {}
    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor):
                seen[value.untyped_storage().data_ptr()] = value.untyped_storage().nbytes()
    return sum(seen.values())


@pytest.mark.parametrize("name", ["adamw", "sgd", "adafactor", "adafactor-torch"])
def test_optimizer_state_bytes_match_real_optimizers(name: str) -> None:
    from transformers.optimization import Adafactor

    model = torch.nn.Sequential(torch.nn.Linear(24, 40), torch.nn.LayerNorm(40), torch.nn.Linear(40, 3))
    opt: torch.optim.Optimizer = {
        "adamw": lambda ps: torch.optim.AdamW(ps),
        "sgd": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
        "adafactor": lambda ps: Adafactor(ps, lr=1e-3, relative_step=False, scale_parameter=False),
        "adafactor-torch": lambda ps: torch.optim.Adafactor(ps),
    }[name](model.parameters())
    model(torch.randn(5, 24)).sum().backward()
    opt.step()
    shapes = tuple(ParamShape(tuple(p.shape), p.element_size()) for p in model.parameters())
    assert optimizer_state_bytes(name, shapes, Target.CPU) == _real_state_bytes(opt)


def test_eight_bit_adamw_is_about_two_bytes_per_param() -> None:
    shapes = (ParamShape((4096, 1024), 4), ParamShape((1024,), 4))
    params = 4096 * 1024 + 1024
    state = optimizer_state_bytes("adamw-8bit", shapes, Target.CPU)
    # Two uint8 states + one fp32 absmax per 256 values each; the small vector keeps fp32 states.
    expected = 2 * 4096 * 1024 + 2 * 4 * math.ceil(4096 * 1024 / 256) + 2 * 4 * 1024 + 2 * 256 * 4
    assert state == expected
    assert 2.0 <= state / params < 2.1


def test_cuda_rounds_every_allocation_to_512_bytes() -> None:
    assert allocation_bytes(1, Target.CUDA) == 512 and allocation_bytes(513, Target.CUDA) == 1024
    assert allocation_bytes(513, Target.CPU) == 513 and allocation_bytes(0, Target.CUDA) == 0
    # AdamW on CUDA: two moments rounded per parameter, and a 4-byte step that takes a whole block.
    shapes = (ParamShape((3,), 4),)
    assert optimizer_state_bytes("adamw", shapes, Target.CUDA) == 3 * 512


def test_model_states_from_the_meta_device(tiny_configs: dict) -> None:
    """Weights and gradients of the real model, counted independently, equal the meta-built figures;
    GPT-2's tied embedding is counted once."""
    from transformers import AutoModelForCausalLM

    planner = Planner(tiny_configs["gpt2"], "causal-lm")
    real = AutoModelForCausalLM.from_config(planner.config)
    storages = {p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in real.parameters()}
    states = planner.states
    assert states.param_bytes == sum(storages.values())
    assert states.parameter_count == sum(p.numel() for p in real.parameters())  # tied: once
    plan = planner.plan(PlanSettings(batch_size=1, seq_len=8, target="cpu"))
    assert plan.parameter_count == states.parameter_count
