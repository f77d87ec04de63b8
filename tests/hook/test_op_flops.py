"""anatomy.hook.op_flops: the counter chosen once per op, with torch's shape formulas given the shapes
mapped here, counts what the same formulas count through torch's own wrapper (``flops_of``), on every op
of real training steps; nested values are left to that wrapper."""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import shape_wrapper

from anatomy.hook import op_flops
from anatomy.hook.opgroups import _classify_base, base_name
from anatomy.vocabulary import OpGroup


class Compare(TorchDispatchMode):
    """Counts every op both ways (shapes mapped here; torch's wrapper) and keeps what each gave."""

    def __init__(self) -> None:
        super().__init__()
        self.pairs: list[tuple[str, float, float]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = base_name(str(func))
        group = _classify_base(name)
        fast = op_flops.counter_for(func, group, name)(args, kwargs, out)
        slow = op_flops.flops_of(func, group, name, args, kwargs, out)
        self.pairs.append((str(func), fast, slow))
        return out


def _training(loss: Callable[[], torch.Tensor], opt: torch.optim.Optimizer) -> Callable[[], None]:
    def step() -> None:
        loss().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def _bert(foreach: bool) -> Callable[[], None]:
    import transformers

    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=500, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128
    )
    model = transformers.BertForSequenceClassification(config)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=foreach)
    ids, labels = torch.randint(0, 500, (2, 16)), torch.randint(0, 2, (2,))
    return _training(lambda: model(input_ids=ids, labels=labels).loss, opt)


def _llama() -> Callable[[], None]:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                         num_hidden_layers=2, vocab_size=256)  # fmt: skip
    model = LlamaForCausalLM(config)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    ids = torch.randint(0, 256, (2, 16))
    return _training(lambda: model(input_ids=ids, labels=ids).loss, opt)


def _convnet() -> Callable[[], None]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
        torch.nn.Conv2d(8, 4, 3, stride=2), torch.nn.Flatten(), torch.nn.LazyLinear(2),
    )  # fmt: skip
    x = torch.randn(2, 3, 16, 16)
    model(x)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return _training(lambda: torch.nn.functional.cross_entropy(model(x), torch.tensor([0, 1])), opt)


def _attention() -> Callable[[], None]:
    q, k, v = (torch.randn(2, 4, 16, 8, requires_grad=True) for _ in range(3))
    a, b = torch.randn(3, 4, 5), torch.randn(3, 5, 6)

    def step() -> None:
        torch.nn.functional.scaled_dot_product_attention(q, k, v).sum().backward()
        torch.bmm(a, b)
        torch.baddbmm(torch.zeros(3, 4, 6), a, b)

    return step


@pytest.mark.parametrize("make", [lambda: _bert(False), lambda: _bert(True), _llama, _convnet, _attention],
                         ids=["bert", "bert-foreach", "llama-fused", "convnet", "attention"])  # fmt: skip
def test_the_counter_chosen_once_counts_what_flops_of_counts_on_every_op(make: Callable[[], Any]) -> None:
    step = make()
    step()  # (the optimizer's states made)
    mode = Compare()
    with mode:
        step()
    assert len(mode.pairs) > 10
    assert [(op, slow) for op, _, slow in mode.pairs] == [(op, fast) for op, fast, _ in mode.pairs]
    counted = {op.split(".")[1] for op, fast, _ in mode.pairs if fast > 0}
    assert counted  # (FLOPs were counted: the comparison is not of zeros)


def test_torchs_shape_formulas_take_the_shapes_mapped_here() -> None:
    """mm, addmm, bmm, convolution and attention go through torch's formulas with the shapes mapped here,
    not through torch's wrapper (its pytree map costs tens of µs a call)."""
    calls: list[str] = []

    class Spy(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            out = func(*args, **(kwargs or {}))
            name = base_name(str(func))
            counter = op_flops.counter_for(func, _classify_base(name), name)
            if counter.__qualname__.startswith("_shaped"):
                calls.append(name)
            return out

    step = _convnet()
    with Spy():
        step()
        _attention()()
    for name in ("convolution", "addmm", "mm", "bmm", "baddbmm"):
        assert name in calls, name


def test_nested_values_are_left_to_torchs_wrapper() -> None:
    seen: list[Any] = []

    def raw(*args: Any, out_shape: Any = None, **kwargs: Any) -> int:
        seen.append((args, kwargs, out_shape))
        return 7

    wrapped = shape_wrapper(raw)
    count = op_flops._shaped(raw, wrapped)
    t = torch.zeros(2, 3)
    Pair = namedtuple("Pair", "a b")
    for args, kwargs, out in [
        ((t, [t, 1], (2, t)), {"k": t, "n": None}, (t, t)),  # flat: mapped here
        ((t, [[t]]), {}, t),  # a list of lists
        ((t,), {"d": {"x": t}}, t),  # a dict
        ((Pair(t, t),), {}, None),  # a named tuple
        ((t,), {}, [t, (t,)]),  # an output nested
        ((t, torch.Size([2, 3])), {}, t),  # a tuple of another class
    ]:
        seen.clear()
        assert count(args, kwargs, out) == 7.0
        here = seen[-1]
        seen.clear()
        assert wrapped(*args, **kwargs, out_val=out) == 7
        assert here == seen[-1]  # what torch's wrapper passes, shape for shape


def test_group_and_name_pick_the_estimate_once() -> None:
    relu = torch.ops.aten.relu.default
    x = torch.randn(3, 5)
    assert op_flops.counter_for(relu, OpGroup.ELEMENTWISE, "relu")((x,), {}, relu(x)) == 15.0
    softmax = torch.ops.aten._softmax.default
    out = softmax(x, 1, False)
    assert op_flops.counter_for(softmax, OpGroup.NORMALIZATION, "_softmax")((x, 1, False), {}, out) == 75.0
    total = torch.ops.aten.sum.default
    assert op_flops.counter_for(total, OpGroup.ELEMENTWISE, "sum")((x,), {}, total(x)) == 15.0
    view = torch.ops.aten.view.default
    assert op_flops.counter_for(view, OpGroup.OTHER, "view")((x, [15]), {}, x.view(15)) == 0.0
