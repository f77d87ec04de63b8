"""anatomy.hook.opgroups: the classification table and the sampled-step profiler on real torch code."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import anatomy.hook.op_flops as op_flops
import anatomy.hook.opgroups as opgroups
from anatomy.hook.opgroups import OpGroupProfiler, base_name, classify
from anatomy.protocol import OpGroupStat
from anatomy.vocabulary import OpGroup, Phase

C, N, E, OPT, X = (
    OpGroup.CONTRACTION,
    OpGroup.NORMALIZATION,
    OpGroup.ELEMENTWISE,
    OpGroup.OPTIMIZER,
    OpGroup.OTHER,
)


@pytest.mark.parametrize(
    ("name", "group"),
    [
        ("aten.mm.default", C),
        ("aten::addmm", C),
        ("addmm", C),
        ("aten.bmm.default", C),
        ("aten.baddbmm.default", C),
        ("matmul", C),
        ("linear", C),
        ("einsum", C),
        ("aten._scaled_mm.default", C),
        ("aten.convolution.default", C),
        ("aten.convolution_backward.default", C),
        ("aten.cudnn_convolution.default", C),
        ("aten._scaled_dot_product_flash_attention.default", C),
        ("aten._scaled_dot_product_efficient_attention_backward.default", C),
        ("aten._scaled_dot_product_flash_attention_for_cpu_backward.default", C),
        ("aten._flash_attention_forward.default", C),
        ("aten._efficient_attention_backward.default", C),
        ("torch.ops.aten.mm.default", C),
        ("aten._softmax.default", N),
        ("aten._safe_softmax.default", N),
        ("aten._softmax_backward_data.default", N),
        ("aten._log_softmax.default", N),
        ("aten._log_softmax_backward_data.default", N),
        ("aten.native_layer_norm.default", N),
        ("aten.native_layer_norm_backward.default", N),
        ("aten.native_batch_norm.default", N),
        ("aten.native_batch_norm_backward.default", N),
        ("aten.native_group_norm.default", N),
        ("aten._fused_rms_norm.default", N),
        ("aten._fused_rms_norm_backward.default", N),
        ("rms_norm", N),
        ("aten.add.Tensor", E),
        ("aten.add_.Tensor", E),
        ("aten.mul.Tensor", E),
        ("aten.div.Tensor", E),
        ("aten.sub.Tensor", E),
        ("aten.gelu.default", E),
        ("aten.gelu_backward.default", E),
        ("aten.tanh.default", E),
        ("aten.tanh_backward.default", E),
        ("aten.relu.default", E),
        ("aten.silu.default", E),
        ("aten.silu_backward.default", E),
        ("aten.sigmoid.default", E),
        ("aten.threshold_backward.default", E),
        ("aten.where.self", E),
        ("aten.masked_fill.Scalar", E),
        ("aten.native_dropout.default", E),
        ("aten.native_dropout_backward.default", E),
        ("aten.bernoulli_.float", E),
        ("aten.pow.Tensor_Scalar", E),
        ("aten.rsqrt.default", E),
        ("aten.exp.default", E),
        ("aten.neg.default", E),
        ("aten.sum.dim_IntList", E),
        ("aten.addcmul_.default", E),  # element-wise by name; OPTIMIZER only in the optimizer phase
        ("aten._foreach_mul_.Scalar", OPT),
        ("aten._foreach_addcdiv_.ScalarList", OPT),
        ("aten._fused_adamw_.default", OPT),
        ("aten._fused_adam_.default", OPT),
        ("aten.view.default", X),
        ("aten.copy_.default", X),
        ("aten.embedding.default", X),
        ("aten.embedding_dense_backward.default", X),
        ("aten.nll_loss_forward.default", X),
        ("aten.t.default", X),
        ("aten.detach.default", X),
        ("aten._local_scalar_dense.default", X),
        ("aten.convert_element_type", X),
        ("prims.convert_element_type.default", X),
        ("aten.conv2d", C),
        ("aten.conv_transpose2d.input", C),
        ("aten.slow_conv_dilated2d", C),
        ("profiler._record_function_enter_new.default", X),
        ("", X),
        ("aten.", X),
        ("__and__", X),
    ],
)
def test_classify_table(name: str, group: OpGroup) -> None:
    assert classify(name) is group


def test_base_name_strips_namespace_overload_inplace_and_backward() -> None:
    assert base_name("aten.mul_.Tensor") == "mul"
    assert base_name("aten::native_layer_norm_backward") == "native_layer_norm"
    assert base_name("aten._softmax_backward_data.default") == "_softmax"
    assert base_name("_foreach_add_") == "_foreach_add"


# -- the profiler on real ops --------------------------------------------------------------------


def test_linear_flops_match_the_textbook_count_forward_and_backward() -> None:
    torch.manual_seed(0)
    batch, n_in, n_out = 16, 32, 24
    layer = torch.nn.Linear(n_in, n_out)
    x = torch.randn(batch, n_in, requires_grad=True)
    prof = OpGroupProfiler()
    with prof:
        layer(x).sum().backward()
    result = prof.result()
    assert result is not None
    matmul = 2 * batch * n_in * n_out
    # forward addmm, backward grad-input mm and grad-weight mm
    assert result[OpGroup.CONTRACTION].flops == 3 * matmul
    # the bias gradient is a reduction over batch x n_out elements, the loss a sum over the same
    assert result[OpGroup.ELEMENTWISE].flops == 2 * batch * n_out
    assert prof.total_flops == sum(s.flops or 0 for s in result.values())


def test_result_is_none_while_profiling_and_stable_after() -> None:
    prof = OpGroupProfiler()
    with prof:
        torch.randn(8, 8) @ torch.randn(8, 8)
        assert prof.result() is None
    first = prof.result()
    assert first is not None and first is prof.result()
    assert first[OpGroup.CONTRACTION].flops == 2 * 8 * 8 * 8
    assert all(isinstance(s, OpGroupStat) for s in first.values())


def test_cpu_flash_attention_is_counted_where_flop_counter_mode_sees_nothing() -> None:
    b, h, s, d = 2, 4, 32, 16
    q, k, v = (torch.randn(b, h, s, d, requires_grad=True) for _ in range(3))
    prof = OpGroupProfiler()
    with prof:
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        forward = prof.total_flops
        out.sum().backward()
    # forward: Q K^T and P V, 2*b*h*s*s*d each
    assert forward == 4 * b * h * s * s * d
    result = prof.result()
    assert result is not None
    # backward recomputes Q K^T, then dV, dP, dQ, dK: five more matmuls
    assert result[OpGroup.CONTRACTION].flops == 4 * b * h * s * s * d + 10 * b * h * s * s * d
    with FlopCounterMode(display=False) as counter:
        torch.nn.functional.scaled_dot_product_attention(q, k, v).sum().backward()
    assert counter.get_total_flops() == 0  # the reason we count this kernel ourselves


@pytest.fixture(scope="module")
def bert_step() -> Callable[[OpGroupProfiler | None], None]:
    import transformers

    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=1000,
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=512,
        max_position_embeddings=128,
    )
    model = transformers.BertForSequenceClassification(config)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    inputs = torch.randint(0, config.vocab_size, (4, 64))
    labels = torch.randint(0, 2, (4,))

    def step(prof: OpGroupProfiler | None = None) -> None:
        loss = model(input_ids=inputs, labels=labels).loss
        loss.backward()
        if prof is not None:
            prof.set_phase(Phase.OPTIMIZER)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if prof is not None:
            prof.set_phase(Phase.FORWARD)

    step()  # the first step creates the optimizer states
    return step


def test_bert_training_step_shares_and_totals(bert_step: Callable[[OpGroupProfiler | None], None]) -> None:
    with FlopCounterMode(display=False) as counter:
        bert_step(None)
    reference = counter.get_total_flops()
    prof = OpGroupProfiler()
    with prof:
        bert_step(prof)
    result = prof.result()
    assert result is not None and reference > 0
    total = sum(s.flops or 0.0 for s in result.values())
    assert total == pytest.approx(prof.total_flops)
    assert abs(total - reference) / reference < 0.05
    assert result[OpGroup.CONTRACTION].flops / total > 0.95
    # The contractions alone are exactly what FlopCounterMode counts (same formulas, same ops).
    assert result[OpGroup.CONTRACTION].flops == reference
    for group in (
        OpGroup.CONTRACTION,
        OpGroup.NORMALIZATION,
        OpGroup.ELEMENTWISE,
        OpGroup.OPTIMIZER,
        OpGroup.OTHER,
    ):
        assert group in result, group
        assert (result[group].time_s or 0.0) > 0.0, group
    for group in (OpGroup.NORMALIZATION, OpGroup.ELEMENTWISE, OpGroup.OPTIMIZER):
        assert (result[group].flops or 0.0) > 0.0, group
    assert result[OpGroup.OTHER].flops == 0.0


def test_backward_ops_are_captured(bert_step: Callable[[OpGroupProfiler | None], None]) -> None:
    seen: list[str] = []
    original = opgroups.base_name

    def spy(op_name: str) -> str:  # the profiler names each op it sees once, by its full name
        seen.append(op_name)
        return original(op_name)

    prof = OpGroupProfiler()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(opgroups, "base_name", spy)
        mp.setattr(opgroups, "_PLANS", {})  # (ops named before, by other profilers: named again)
        with prof:
            bert_step(prof)
    for op in (
        "native_layer_norm_backward",
        "gelu_backward",
        "_softmax_backward_data",
        "embedding_dense_backward",
    ):
        assert any(op in s for s in seen), op


def test_without_set_phase_the_optimizer_math_counts_as_element_wise(
    bert_step: Callable[[OpGroupProfiler | None], None],
) -> None:
    class NoPhase(OpGroupProfiler):
        def set_phase(self, phase: Phase) -> None:
            pass

    prof = NoPhase()
    with prof:
        bert_step(prof)
    result = prof.result()
    assert result is not None and OpGroup.OPTIMIZER not in result
    assert OpGroup.ELEMENTWISE in result


class PyRMSNorm(torch.nn.Module):
    """An RMSNorm written in element-wise Python, as transformers' LlamaRMSNorm is."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        variance = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(variance + 1e-6))


class PyScaler(PyRMSNorm):
    """The same ops under a name that does not say "Norm"."""


class PreNorm(torch.nn.Module):
    """A wrapper named *Norm with children: not a normalization itself."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x * 2.0)


def _profile_block(norm: torch.nn.Module, batch: int = 8, dim: int = 16) -> dict[OpGroup, OpGroupStat]:
    torch.manual_seed(0)
    head = torch.nn.Linear(dim, dim)
    x = torch.randn(batch, dim, requires_grad=True)
    prof = OpGroupProfiler(norm.modules())
    with prof:
        head(norm(x)).sum().backward()
    result = prof.result()
    assert result is not None
    return result


def test_python_normalization_modules_count_as_normalization_forward_and_backward() -> None:
    batch, dim = 8, 16
    result = _profile_block(PyRMSNorm(dim), batch, dim)
    # Outside the norm only the loss sum and the head's bias-gradient reduction are element-wise:
    # every pow/mean/add/rsqrt/mul of the norm, forward and backward, went to NORMALIZATION.
    assert result[OpGroup.ELEMENTWISE].flops == 2 * batch * dim
    assert (result[OpGroup.NORMALIZATION].flops or 0) > 6 * batch * dim
    assert (result[OpGroup.NORMALIZATION].time_s or 0) > 0
    renamed = _profile_block(PyScaler(dim), batch, dim)
    assert OpGroup.NORMALIZATION not in renamed
    assert (
        renamed[OpGroup.ELEMENTWISE].flops
        == result[OpGroup.ELEMENTWISE].flops + result[OpGroup.NORMALIZATION].flops
    )


def test_a_wrapper_named_norm_is_not_a_normalization() -> None:
    result = _profile_block(PreNorm(16))
    assert OpGroup.NORMALIZATION not in result


def test_module_hooks_are_removed_after_profiling() -> None:
    norm = PyRMSNorm(4)
    prof = OpGroupProfiler(norm.modules())
    with prof:
        norm(torch.randn(2, 4, requires_grad=True))
    assert prof.norm_forwards == 1
    norm(torch.randn(2, 4, requires_grad=True))  # a hook left behind would record a second range
    # (torch lists a module's hooks only in these dicts)
    assert prof.norm_forwards == 1 and not norm._forward_pre_hooks and not norm._forward_hooks


def test_a_failing_flop_formula_never_breaks_the_step(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: Any, **kwargs: Any) -> float:
        raise RuntimeError("formula bug")

    monkeypatch.setattr(op_flops, "_max_numel", broken)  # (what an element-wise op's estimate calls)
    prof = OpGroupProfiler()
    with prof:
        y = torch.relu(torch.randn(4, 4))
    assert y.shape == (4, 4)
    result = prof.result()
    assert result is not None and prof.errors >= 1
    assert result[OpGroup.ELEMENTWISE].flops == 0.0


def test_an_op_whose_counter_cannot_be_chosen_counts_zero_flops_and_an_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(func: Any, group: OpGroup, name: str) -> Any:
        raise AttributeError("no overloadpacket")

    monkeypatch.setattr(opgroups, "counter_for", broken)
    monkeypatch.setattr(opgroups, "_PLANS", {})
    prof = OpGroupProfiler()
    a = torch.randn(4, 4)
    with prof:
        y = (a @ a).relu()
    assert torch.equal(y, (a @ a).relu())
    result = prof.result()
    assert result is not None and prof.errors == 2
    assert result[OpGroup.CONTRACTION].flops == 0.0 and result[OpGroup.ELEMENTWISE].flops == 0.0
    assert (result[OpGroup.CONTRACTION].time_s or 0.0) > 0.0  # (timed all the same)


# -- CUDA timing logic, with the device replaced by fakes (no GPU on CI) ---------------------------


class FakeEvent:
    done = False

    def __init__(self, enable_timing: bool = False) -> None:
        assert enable_timing

    def record(self, stream: object = None) -> None:
        self.stream = stream

    def query(self) -> bool:
        return FakeEvent.done

    def elapsed_time(self, end: FakeEvent) -> float:
        assert FakeEvent.done, "elapsed_time before the events completed would block"
        return 2.0  # milliseconds


def test_cuda_times_resolve_lazily_without_synchronizing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(opgroups, "_device_of", lambda args: torch.device("cuda", 0))
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: "stream-0")
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: pytest.fail("synchronize called"))
    FakeEvent.done = False
    prof = OpGroupProfiler()
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    with prof:
        (a @ b).relu()  # mm, relu: two timed ops
    assert prof.result() is None  # the device has not finished
    assert prof.result() is None
    FakeEvent.done = True
    result = prof.result()
    assert result is not None
    assert result[OpGroup.CONTRACTION].time_s == pytest.approx(0.002)
    assert result[OpGroup.ELEMENTWISE].time_s == pytest.approx(0.002)
    assert result[OpGroup.CONTRACTION].flops == 2 * 4 * 4 * 4
