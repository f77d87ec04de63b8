"""Building the user's model from its config, and the micro-batch it is fed.

The same functions build the fake model of a plan and, in the tests, the real model it is checked
against, so both train the same module with the same inputs.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from anatomy.plan.settings import PlanError, Task
from anatomy.plan.workload import Workload


def auto_class(task: Task) -> Any:
    import transformers

    return {
        Task.CAUSAL_LM: transformers.AutoModelForCausalLM,
        Task.SEQUENCE_CLASSIFICATION: transformers.AutoModelForSequenceClassification,
        Task.MASKED_LM: transformers.AutoModelForMaskedLM,
        Task.SEQ2SEQ_LM: transformers.AutoModelForSeq2SeqLM,
        Task.IMAGE_CLASSIFICATION: transformers.AutoModelForImageClassification,
        Task.SPEECH_SEQ2SEQ: transformers.AutoModelForSpeechSeq2Seq,
    }[task]


def model_class(config: Any, task: Task) -> type:
    """The class ``build_model`` instantiates, without building it (PlanError: the task does not fit)."""
    auto = auto_class(task)
    mapping = getattr(auto, "_model_mapping", None)
    try:
        return mapping[type(config)] if mapping is not None else auto
    except KeyError:
        name = getattr(config, "model_type", type(config).__name__)
        raise PlanError(
            f"{name} models have no {task.value} head in transformers (pass --task; one of "
            f"{', '.join(t.value for t in Task)})"
        ) from None


def prepare_config(config: Any, task: Task, use_cache: bool | None = None) -> Any:
    """The config the plan builds (and the tests build their real model from): what a user's training
    script needs set for the task to run at all."""
    cfg = copy.deepcopy(config)
    if task is Task.SEQUENCE_CLASSIFICATION and getattr(cfg, "pad_token_id", None) is None:
        # Decoder models refuse batches > 1 for classification without a pad token.
        eos = getattr(cfg, "eos_token_id", None)
        cfg.pad_token_id = (eos[0] if isinstance(eos, list) else eos) if eos is not None else 0
    if (
        task in (Task.SEQ2SEQ_LM, Task.SPEECH_SEQ2SEQ)
        and getattr(cfg, "decoder_start_token_id", None) is None
    ):
        # T5's configs on the hub name it (the pad token); a config written from scratch may not.
        cfg.decoder_start_token_id = getattr(cfg, "pad_token_id", None) or 0
    if use_cache is not None:
        cfg.use_cache = use_cache
    return cfg


def build_model(config: Any, task: Task | str) -> Any:
    return auto_class(Task(task)).from_config(config)


def enable_checkpointing(model: Any) -> None:
    """Per-layer activation checkpointing, as transformers does it (renamed in transformers 5)."""
    if not getattr(model, "supports_gradient_checkpointing", False):
        raise PlanError(f"{type(model).__name__} does not support gradient checkpointing")
    enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
    enable()


def padded_lengths(batch: int, seq: int) -> list[int]:
    """Tokens kept per row of a padded batch: every row has some padding (from an eighth of the row
    for the first of four to half for the last), as sequences padded to a common length do."""
    return [max(1, seq - ((b + 1) * seq) // (2 * batch)) for b in range(batch)]


def _padding_mask(batch: int, seq: int, device: str | torch.device) -> torch.Tensor:
    """1 where a row has a token, 0 on its padding (a handful of ops whatever the batch)."""
    lengths = torch.tensor(padded_lengths(batch, seq), device=device)
    return (torch.arange(seq, device=device)[None, :] < lengths[:, None]).long()


def make_inputs(config: Any, workload: Workload, device: str | torch.device = "cpu") -> dict[str, Any]:
    """One micro-batch as a data collator builds it: token ids right-padded with the pad token, an
    attention mask with zeros on the padding and labels of -100 there (ignored by the loss); or
    images and class ids. In the fake step these integer tensors hold real values (see
    ``anatomy.plan.values``), so the model decides on them as it does in training."""
    w = workload
    b = w.batch_size
    if w.task is Task.IMAGE_CLASSIFICATION:
        assert w.image_size is not None and w.channels is not None
        inputs: dict[str, Any] = {
            "pixel_values": torch.randn(b, w.channels, w.image_size, w.image_size, device=device),
            "labels": torch.zeros(b, dtype=torch.long, device=device),
        }
        if w.interpolate_pos_encoding:
            inputs["interpolate_pos_encoding"] = True
        return inputs
    if w.task is Task.SPEECH_SEQ2SEQ:
        return speech_inputs(config, w, device)
    assert w.seq_len is not None
    vocab = int(getattr(config, "vocab_size", 30000) or 30000)
    pad = getattr(config, "pad_token_id", None)
    pad = pad if isinstance(pad, int) else 0
    low = min(100, vocab - 1)
    ids = torch.randint(low, vocab, (b, w.seq_len), device=device)
    inputs = {"input_ids": ids}
    mask = None
    if w.padded:
        mask = _padding_mask(b, w.seq_len, device)
        ids.masked_fill_(mask == 0, pad)
        inputs["attention_mask"] = mask
    if w.task is Task.SEQUENCE_CLASSIFICATION:
        inputs["labels"] = torch.zeros(b, dtype=torch.long, device=device)
    elif w.task is Task.SEQ2SEQ_LM:
        assert w.target_len is not None
        labels = torch.randint(low, vocab, (b, w.target_len), device=device)
        if w.padded:
            labels.masked_fill_(_padding_mask(b, w.target_len, device) == 0, -100)
        inputs["labels"] = labels
    else:
        inputs["labels"] = ids.masked_fill(mask == 0, -100) if mask is not None else ids.clone()
    return inputs


def speech_inputs(config: Any, workload: Workload, device: str | torch.device = "cpu") -> dict[str, Any]:
    """A speech batch as Whisper's feature extractor and a seq2seq collator build it: log-mel
    features (batch, mel bins, frames) and label tokens, -100 on their padding."""
    w = workload
    assert w.audio_frames is not None and w.mel_bins is not None and w.target_len is not None
    vocab = int(getattr(config, "vocab_size", 30000) or 30000)
    labels = torch.randint(min(100, vocab - 1), vocab, (w.batch_size, w.target_len), device=device)
    if w.padded:
        labels.masked_fill_(_padding_mask(w.batch_size, w.target_len, device) == 0, -100)
    features = torch.randn(w.batch_size, w.mel_bins, w.audio_frames, device=device)
    return {"input_features": features, "labels": labels}
