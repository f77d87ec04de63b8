"""CUDA kernels on fake CPU tensors (anatomy.plan.kernels): dropout masks and fused attention."""

from __future__ import annotations

import copy

import pytest

from anatomy.plan import Planner, PlanSettings
from anatomy.vocabulary import Component


def test_cuda_target_keeps_one_byte_dropout_masks(tiny_configs: dict) -> None:
    """CPU dropout saves a float noise tensor, CUDA's native_dropout a bool mask: 3 bytes less per
    dropped element. BERT (eager attention, so both targets run the same attention code) drops the
    embeddings, each layer's attention probabilities (B x heads x S x S), attention and FFN outputs
    (B x S x H each) and the pooled output (B x H)."""
    bert = tiny_configs["bert"]
    cfg = type(bert).from_dict(bert.to_dict(), attn_implementation="eager")
    planner = Planner(cfg, "sequence-classification")
    b, s, h, heads, layers = 2, 32, cfg.hidden_size, cfg.num_attention_heads, cfg.num_hidden_layers
    cpu = planner.plan(PlanSettings(batch_size=b, seq_len=s, target="cpu", padded=False))
    cuda = planner.plan(PlanSettings(batch_size=b, seq_len=s, target="cuda", padded=False))
    dropped = (1 + 2 * layers) * b * s * h + layers * b * heads * s * s + b * h
    diff = cpu.components[Component.ACTIVATIONS] - cuda.components[Component.ACTIVATIONS]
    # The CUDA target also rounds every saved storage up to 512 bytes: allow that much per tensor.
    assert abs(diff - 3 * dropped) <= 512 * 40


def test_fused_attention_does_not_keep_probabilities(tiny_configs: dict) -> None:
    """Unfused attention keeps, per element of the B x heads x S x S probabilities, the fp32 softmax
    output (4 bytes), the dropout mask (1) and the dropped fp32 probabilities (4): a term quadratic in
    the sequence length. Fused attention keeps O(S) per row: activations are linear in S."""
    cfg = copy.deepcopy(tiny_configs["gpt2"])
    cfg.n_positions = 256
    planner = Planner(cfg, "causal-lm")
    b, heads, layers = 2, cfg.n_head, cfg.n_layer

    def acts(seq: int, fused: bool) -> int:
        settings = PlanSettings(batch_size=b, seq_len=seq, fused_attention=fused, padded=False)
        value = planner.plan(settings).components[Component.ACTIVATIONS]
        assert value is not None
        return value

    for fused in (True, False):
        # a(S) = alpha S + beta S^2  =>  a(256) - 2 a(128) = beta (256^2 - 2 * 128^2) = 2 beta 128^2
        quadratic = (acts(256, fused) - 2 * acts(128, fused)) / 2
        per_prob = quadratic / (layers * b * heads * 128 * 128)
        if fused:
            assert abs(per_prob) < 0.01
        else:
            assert 9.0 <= per_prob < 9.5


def test_padding_mask_becomes_one_float_bias_per_layer_under_fused_attention(tiny_configs: dict) -> None:
    """With a padding mask, CUDA's memory-efficient kernel takes a float bias: torch converts the
    boolean (B, 1, S, S) mask per call, and the kernel saves it for backward: 4 bytes per mask
    element per layer, quadratic in S (the boolean mask itself is built once and not saved)."""
    cfg = copy.deepcopy(tiny_configs["llama"])
    cfg.max_position_embeddings = 256
    planner = Planner(cfg, "causal-lm")
    b, layers = 2, cfg.num_hidden_layers

    def extra(seq: int) -> int:
        padded = planner.plan(PlanSettings(batch_size=b, seq_len=seq, use_cache=False))
        unpadded = planner.plan(PlanSettings(batch_size=b, seq_len=seq, use_cache=False, padded=False))
        return padded.components[Component.ACTIVATIONS] - unpadded.components[Component.ACTIVATIONS]

    per_element = (extra(256) - 2 * extra(128)) / (2 * b * 128 * 128)
    assert per_element == pytest.approx(4 * layers, rel=0.01)
