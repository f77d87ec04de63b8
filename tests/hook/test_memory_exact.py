"""Weights, gradients and optimizer states equal independent numel * element_size sums, exactly."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from anatomy.memory import (
    HostHeap,
    SavedTensorCounter,
    detect_optimizer,
    detect_precision,
    gradient_bytes,
    is_oom,
    optimizer_state_bytes,
    parameter_count,
    unwrap_optimizer,
    weight_bytes,
)
from anatomy.vocabulary import OptimizerKind, Precision


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


def test_unwrap_and_detect_through_wrappers() -> None:
    p = torch.nn.Parameter(torch.zeros(4))
    opt = torch.optim.AdamW([p])
    wrapper = SimpleNamespace(optimizer=opt)  # the shape of accelerate's AcceleratedOptimizer
    assert unwrap_optimizer(wrapper) is opt
    assert detect_optimizer(wrapper) is OptimizerKind.ADAMW
    assert detect_optimizer(None) is OptimizerKind.NONE
    assert detect_optimizer(torch.optim.Adagrad([p])) is OptimizerKind.OTHER


def test_detect_precision() -> None:
    assert detect_precision(param_dtype=torch.float32) is Precision.FP32
    assert detect_precision(param_dtype=torch.float32, autocast_dtype=torch.bfloat16) is Precision.BF16_MIXED
    assert detect_precision(param_dtype=torch.float32, autocast_dtype=torch.float16) is Precision.FP16_MIXED
    assert detect_precision(param_dtype=torch.float32, grad_scaler=True) is Precision.FP16_MIXED
    assert detect_precision(param_dtype=torch.bfloat16) is Precision.BF16
    assert detect_precision(torch.nn.Linear(2, 2).half()) is Precision.FP16


def test_host_heap_tracks_tensor_allocations() -> None:
    heap = HostHeap()
    assert heap.available  # glibc with mallinfo2 on this platform
    before = heap.in_use()
    assert before is not None
    t = torch.ones(8 * 1024 * 1024, dtype=torch.uint8)  # 8 MiB
    during = heap.in_use()
    assert during is not None and during - before >= t.numel()
    del t
    after = heap.in_use()
    assert after is not None and during - after >= 8 * 1024 * 1024


def test_saved_tensor_counter_skips_parameters_and_counts_storages_once() -> None:
    lin = torch.nn.Linear(64, 64)
    x = torch.randn(32, 64, requires_grad=True)
    counter = SavedTensorCounter(lin.parameters())
    with counter:
        h = lin(x)
        y = torch.tanh(h)  # saves its output
        z = (y * y).sum()  # saves y twice: one storage
    # linear saves x (weight is a parameter: skipped); tanh saves y; mul saves y (same storage).
    assert counter.activation_bytes == x.numel() * 4 + y.numel() * 4
    assert counter.weight_copy_bytes == 0
    assert not counter.active
    z.backward()


def test_is_oom() -> None:
    assert is_oom(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert is_oom(RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1 bytes"))
    assert is_oom(MemoryError())
    assert not is_oom(ValueError("shapes do not match"))


def test_alive_saved_tensors_are_followed_through_backward() -> None:
    """On a traced step the counter knows what is still held at any moment: everything saved after the
    forward, less as backward frees each node's saved tensors, nothing after it."""
    lin1, lin2 = torch.nn.Linear(64, 128), torch.nn.Linear(128, 8)
    params = [*lin1.parameters(), *lin2.parameters()]
    x = torch.randn(32, 64)
    counter = SavedTensorCounter(params)
    counter.track_alive = True
    seen_in_backward: list[int] = []
    with counter:
        h = lin1(x)
        a = torch.relu(h)  # saves its output a
        y = lin2(a)  # saves a again (same storage): counted once
        loss = (y * y).sum()  # saves y
    assert (
        counter.alive_activation_bytes
        == counter.activation_bytes
        == a.numel() * 4 + y.numel() * 4 + x.numel() * 4
    )
    a.register_hook(lambda g: seen_in_backward.append(counter.alive_activation_bytes))
    del h, a, y
    loss.backward()
    # when a's gradient arrived, mul's saved y was freed; relu's saved a (its output) not yet
    assert seen_in_backward == [x.numel() * 4 + 32 * 128 * 4]
    assert counter.alive_activation_bytes == x.numel() * 4  # x is still held here, by the test
    del x
    assert counter.alive_activation_bytes == 0
    counter.track_alive = False


def test_gradient_watcher_counts_gradients_as_they_appear() -> None:
    from anatomy.memory import GradientWatcher

    lin1, lin2 = torch.nn.Linear(16, 32), torch.nn.Linear(32, 4)
    params = [*lin1.parameters(), *lin2.parameters()]
    watch = GradientWatcher(params)
    assert watch.bytes == 0
    lin2(lin1(torch.randn(8, 16))).sum().backward()
    assert watch.bytes == gradient_bytes(params) == sum(p.numel() * 4 for p in params)
    lin2(lin1(torch.randn(8, 16))).sum().backward()  # accumulates into the same tensors: no change
    assert watch.bytes == gradient_bytes(params)
    torch.optim.SGD(params, lr=0.1).zero_grad(set_to_none=True)  # freed: no longer held
    assert watch.bytes == 0
    lin2(lin1(torch.randn(8, 16))).sum().backward()  # new gradient tensors: counted once more
    assert watch.bytes == gradient_bytes(params) == sum(p.numel() * 4 for p in params)
    watch.close()
    assert all(not p._post_accumulate_grad_hooks for p in params)  # closed: no hook left behind
