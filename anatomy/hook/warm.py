"""The sampled-step instruments' first-time costs, paid with the set-up instead of on a step.

The first time any dispatch mode runs in a process, torch builds its Python dispatch path (its rule
registry, an op's Python overload, its effects entry), and the first time the op-group profiler and the
per-op trace see an op they plan it (its group, its FLOP formula, whether it allocates). On step 1, the
first sampled step, all of that came on top of the instrument's own per-op cost: a 2-block MLP's step 1
took 7.9 usual steps more, a later sampled step 1.6 (``benchmarks/profile_first_steps.py``). Issue 19 asks
that no step be held up by more than its own duration by our work; ``track()`` is not a step.

So the set-up runs a tiny step of its own under both instruments, once per process: a linear layer, the
activations and normalizations of common models, a loss, its backward, and an Adam update written out
(single-tensor and ``_foreach_``) — on a few CPU tensors of its own, no random op (the user's generator is
not advanced), no module (no module hook, the user's global ones included, fires), nothing on a GPU (its
allocator's statistics are the user's). Where anything could see it — a dispatch or function mode on the
stack, saved-tensor hooks the user set, a compile in progress — it does not run; nor where torch's
compiler is not imported yet (a dispatch mode's first op imports it, ~2 s; torch's optimizers and
transformers' models import it anyway, before ``track()`` is given them).
"""

from __future__ import annotations

import logging
import sys

import torch
import torch.nn.functional as F

from anatomy.hook.opgroups import OpGroupProfiler
from anatomy.hook.trace import MemoryTrace

log = logging.getLogger("anatomy")
_done = False


def _len(name: str) -> int:
    fn = getattr(torch._C, name, None)
    return int(fn()) if fn is not None else 0


def _quiet() -> bool:
    """Nothing of the user's could see the warm-up: no mode on a stack, no saved-tensor hooks, no compile."""
    if _len("_len_torch_dispatch_stack") or _len("_len_torch_function_stack"):
        return False
    if "torch._dynamo" not in sys.modules:  # (an op's first dispatch to a mode imports it: ~2 s, a
        return False  # process that never does — no torch.optim, no transformers model — is spared it)
    top = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)
    if top is None or top(False) is not None or torch.is_inference_mode_enabled():
        return False
    compiling = getattr(torch.compiler, "is_compiling", None)
    return not (compiling is not None and compiling())


def _tiny_step() -> None:
    """A step of a tiny model, written out in functions (see the module's docstring)."""
    cpu, f32 = torch.device("cpu"), torch.float32
    w = torch.full((4, 3), 0.1, device=cpu, dtype=f32, requires_grad=True)
    b = torch.zeros(4, device=cpu, dtype=f32, requires_grad=True)
    table = torch.full((5, 3), 0.2, device=cpu, dtype=f32, requires_grad=True)
    ids = torch.tensor([[0, 1], [2, 3]], device=cpu)
    x = F.embedding(ids, table)  # (2, 2, 3)
    h = F.linear(x, w, b)  # a 3-D input: view, mm
    h = F.layer_norm(h, (4,))
    rms = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
    act = F.relu(rms) + F.gelu(rms) + F.silu(rms)
    att = torch.softmax(torch.matmul(act, act.transpose(-1, -2)) / 2.0, dim=-1)
    mixed = torch.cat([torch.matmul(att, act), act], dim=-1).reshape(4, 8)
    flat = F.linear(mixed[:, :3], w, b)  # a 2-D input: t, addmm
    loss = F.cross_entropy(flat, torch.tensor([0, 1, 2, 3], device=cpu)) + flat.mean()
    loss.backward()
    with torch.no_grad():
        params = [w, b, table]
        grads = [p.grad for p in params if p.grad is not None]
        m = [torch.zeros_like(p) for p in params]
        v = [torch.zeros_like(p) for p in params]
        for p, g, mp, vp in zip(params, grads, m, v, strict=False):
            mp.lerp_(g, 0.1)
            vp.mul_(0.999).addcmul_(g, g, value=0.001)
            p.mul_(0.99).addcdiv_(mp, vp.sqrt().div(1.0).add_(1e-8), value=-0.001)
        torch._foreach_lerp_(m, grads, 0.1)
        torch._foreach_mul_(v, 0.999)
        torch._foreach_addcmul_(v, grads, grads, value=0.001)
        denom = torch._foreach_sqrt(v)
        torch._foreach_div_(denom, 1.0)
        torch._foreach_add_(denom, 1e-8)
        torch._foreach_addcdiv_(params, m, denom, value=-0.001)


def warm_instruments() -> None:
    """Once per process, where nothing of the user's could see it: the tiny step under the op-group
    profiler, then under the per-op trace. Never raises."""
    global _done
    if _done or not _quiet():  # (not now: a later tracker's set-up may)
        return
    _done = True
    try:
        with torch.enable_grad():  # (the user's grad mode, as it was, once the block ends)
            with OpGroupProfiler(cuda=False):
                _tiny_step()
            with MemoryTrace(read=lambda: 0):
                _tiny_step()
    except Exception as exc:  # (the steps plan what they meet themselves)
        log.debug("anatomy: the instruments' warm-up failed: %s", exc)


__all__ = ["warm_instruments"]
