"""Weights, gradients and optimizer states equal independent numel * element_size sums, exactly."""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace

import pytest
import torch

from anatomy.hook.detect import detect_optimizer
from anatomy.hook.tensors import gradient_bytes, optimizer_state_bytes, parameter_count, weight_bytes
from anatomy.vocabulary import OptimizerKind


def _unique_params(model: torch.nn.Module) -> list[torch.Tensor]:
    by_id: dict[int, torch.Tensor] = {}
    for _, p in model.named_parameters(remove_duplicate=False):
        by_id[id(p)] = p
    return list(by_id.values())


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def test_weights_count_tied_embeddings_once(hk: SimpleNamespace) -> None:
    model = hk.small_gpt2()
    assert model.lm_head.weight is model.transformer.wte.weight  # tied
    all_refs = list(model.named_parameters(remove_duplicate=False))
    unique = _unique_params(model)
    assert len(all_refs) > len(unique)

    expected: dict[str, int] = {}
    for t in [*unique, *{id(b): b for b in model.buffers()}.values()]:
        key = str(t.dtype).removeprefix("torch.")
        expected[key] = expected.get(key, 0) + _nbytes(t)
    assert weight_bytes(model) == expected
    naive = sum(_nbytes(p) for _, p in all_refs)
    assert sum(weight_bytes(model).values()) < naive + sum(_nbytes(b) for b in model.buffers())
    assert parameter_count(model) == sum(p.numel() for p in unique)


def test_weights_per_dtype(hk: SimpleNamespace) -> None:
    model = hk.small_bert()
    model.classifier.to(torch.bfloat16)
    got = weight_bytes(model)
    fp32 = sum(_nbytes(p) for p in model.parameters() if p.dtype == torch.float32)
    fp32 += sum(_nbytes(b) for b in model.buffers() if b.dtype == torch.float32)
    bf16 = sum(_nbytes(p) for p in model.classifier.parameters())
    assert got["float32"] == fp32
    assert got["bfloat16"] == bf16


def test_gradients_exact(hk: SimpleNamespace) -> None:
    model = hk.small_bert()
    assert gradient_bytes(model) == 0
    model(**hk.bert_batch()).loss.backward()
    expected = sum(_nbytes(p.grad) for p in _unique_params(model) if p.grad is not None)
    assert expected > 0
    assert gradient_bytes(model) == expected
    assert gradient_bytes(list(model.parameters())) == expected
    assert gradient_bytes(model) == 4 * parameter_count(model)  # fp32 gradients: 4 bytes/param


def _state_sum(opt: torch.optim.Optimizer) -> int:
    total = 0
    for st in opt.state.values():
        for v in st.values():
            if isinstance(v, torch.Tensor):
                total += _nbytes(v)
    return total


def _one_step(model: torch.nn.Module, opt: torch.optim.Optimizer, batch: dict[str, torch.Tensor]) -> None:
    model(**batch).loss.backward()
    opt.step()
    opt.zero_grad()


def test_adamw_states_are_8_bytes_per_param(hk: SimpleNamespace) -> None:
    model = hk.small_bert()
    opt = torch.optim.AdamW(model.parameters())
    assert optimizer_state_bytes(opt) == 0
    _one_step(model, opt, hk.bert_batch())
    got = optimizer_state_bytes(opt)
    assert got == _state_sum(opt)
    n_tensors = len(list(model.parameters()))
    step_bytes = sum(_nbytes(st["step"]) for st in opt.state.values())
    assert step_bytes == 4 * n_tensors
    assert (got - step_bytes) / parameter_count(model) == 8.0
    assert detect_optimizer(opt) is OptimizerKind.ADAMW


def test_sgd_momentum_is_4_bytes_per_param_and_plain_sgd_0(hk: SimpleNamespace) -> None:
    model = hk.small_bert()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    _one_step(model, opt, hk.bert_batch())
    assert optimizer_state_bytes(opt) == _state_sum(opt) == 4 * parameter_count(model)
    assert detect_optimizer(opt) is OptimizerKind.SGD_MOMENTUM
    plain = torch.optim.SGD(model.parameters(), lr=0.01)
    _one_step(model, plain, hk.bert_batch())
    assert optimizer_state_bytes(plain) == 0
    assert detect_optimizer(plain) is OptimizerKind.SGD


@pytest.mark.parametrize("impl", ["torch", "transformers"])
def test_adafactor_states_factored(hk: SimpleNamespace, impl: str) -> None:
    model = hk.small_bert()
    if impl == "torch":
        opt: torch.optim.Optimizer = torch.optim.Adafactor(model.parameters(), lr=1e-3)
    else:
        from transformers.optimization import Adafactor

        opt = Adafactor(model.parameters(), lr=1e-3, relative_step=False, scale_parameter=False)
    _one_step(model, opt, hk.bert_batch())
    got = optimizer_state_bytes(opt)
    assert got == _state_sum(opt) > 0
    # Factored second moments: far less than AdamW's 8 bytes/param.
    assert got / parameter_count(model) < 6.0
    assert detect_optimizer(opt) is OptimizerKind.ADAFACTOR


def test_shared_state_storage_counted_once() -> None:
    p = torch.nn.Parameter(torch.zeros(100))
    q = torch.nn.Parameter(torch.zeros(100))
    opt = torch.optim.SGD([p, q], lr=0.1, momentum=0.9)
    shared = torch.zeros(100)
    opt.state[p] = {"momentum_buffer": shared}
    opt.state[q] = {"momentum_buffer": shared[:50]}  # a view of the same storage
    assert optimizer_state_bytes(opt) == 400


def _same(a: Sequence[object], b: Sequence[object]) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))


def test_model_parts_in_one_walk_lists_what_torchs_three_walks_list(hk: SimpleNamespace) -> None:
    """One walk of the modules gives the parameters, buffers and modules torch's ``parameters()``,
    ``buffers()`` and ``modules()`` give, in their order, each once: tied weights, a module used twice, a
    parameter or buffer set to None, a non-persistent buffer; a model overriding ``parameters()`` is
    listed through its override."""
    from anatomy.hook.tensors import model_parts

    shared = torch.nn.Linear(3, 3, bias=False)  # (its bias: None)
    model = torch.nn.Sequential(hk.small_gpt2(), shared, torch.nn.BatchNorm1d(3), shared)
    model[2].register_buffer("scratch", torch.zeros(2), persistent=False)
    model[2].register_buffer("gone", None)
    params, buffers, modules = model_parts(model)
    assert _same(params, list(model.parameters()))
    assert _same(buffers, list(model.buffers()))
    assert _same(modules, list(model.modules()))
    assert len({id(p) for p in params}) == len(params)  # (the tied embedding once)

    class OnlySome(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)

        def parameters(self, recurse: bool = True):  # type: ignore[no-untyped-def,override]
            return iter(self.a.parameters())

    only = OnlySome()
    assert _same(model_parts(only)[0], list(only.a.parameters()))


def test_an_8bit_layers_state_is_found_in_its_dict_or_through_a_property() -> None:
    """``layer_state_tensors`` reads ``state`` from the module's __dict__ (where bitsandbytes sets it) and
    still through a class attribute (a property), never through Module.__getattr__'s failure path."""
    from anatomy.hook.quantized import layer_state_tensors

    class MatmulLtState:  # (duck-typed by its class name, as bitsandbytes' is)
        def __init__(self) -> None:
            self.CB, self.SCB = torch.zeros(4, dtype=torch.int8), torch.ones(2)

    in_dict = torch.nn.Linear(2, 2)
    in_dict.state = MatmulLtState()  # type: ignore[assignment]
    assert [t.shape for t in layer_state_tensors(in_dict)] == [torch.Size([4]), torch.Size([2])]

    class WithProperty(torch.nn.Linear):
        @property
        def state(self) -> MatmulLtState:
            return held

    held = MatmulLtState()
    found = layer_state_tensors(WithProperty(2, 2))
    assert len(found) == 2 and found[0] is held.CB and found[1] is held.SCB
    assert layer_state_tensors(torch.nn.Linear(2, 2)) == []
