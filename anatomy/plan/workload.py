"""One micro-batch as the model sees it: the settings resolved against a model's config.

A :class:`Workload` is what the fake step feeds the model (and what the accuracy tests feed the
real one): token ids with an attention mask when the batch is padded, source and target lengths for
encoder-decoder models, images of a size for vision models, and whether the forward returns a KV
cache that the training loop keeps alive.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

from anatomy.plan.config import position_limit, task_warning
from anatomy.plan.settings import (
    DEFAULT_SEQ_LEN,
    PlanError,
    PlanSettings,
    Task,
    check_shape,
    check_task_options,
)


@dataclass(frozen=True)
class Workload:
    task: Task
    batch_size: int
    seq_len: int | None  # tokens per sequence (seq2seq: the source); None for images
    target_len: int | None  # seq2seq: label tokens
    image_size: int | None  # image tasks: pixels per side
    channels: int | None
    padded: bool  # the batch carries an attention mask with padding
    use_cache: bool  # the forward returns a KV cache (the config's use_cache, or as set)
    interpolate_pos_encoding: bool  # ViT-style models fed another image size than their config's
    audio_frames: int | None = None  # speech: feature frames per clip (100 a second)
    mel_bins: int | None = None  # speech: features per frame

    def describe(self) -> str:
        if self.task is Task.IMAGE_CLASSIFICATION:
            return f"batch {self.batch_size} x {self.image_size}x{self.image_size} images"
        if self.task is Task.SPEECH_SEQ2SEQ:
            seconds = (self.audio_frames or 0) / FRAMES_PER_SECOND
            text = f"batch {self.batch_size} x {seconds:g} s audio / target {self.target_len} tokens"
            return text + (", padded labels" if self.padded else "")
        if self.task is Task.SEQ2SEQ_LM:
            text = f"batch {self.batch_size} x source {self.seq_len} / target {self.target_len} tokens"
        else:
            text = f"batch {self.batch_size} x seq {self.seq_len}"
        return text + (", padded" if self.padded else ", unpadded")

    def to_dict(self) -> dict[str, Any]:
        return {
            "task": self.task.value,
            "batch_size": self.batch_size,
            "seq_len": self.seq_len,
            "target_len": self.target_len,
            "image_size": self.image_size,
            "channels": self.channels,
            "padded": self.padded,
            "use_cache": self.use_cache,
            "interpolate_pos_encoding": self.interpolate_pos_encoding,
            "audio_frames": self.audio_frames,
            "mel_bins": self.mel_bins,
        }


FRAMES_PER_SECOND = 100  # Whisper's (and Speech2Text's) features: a 10 ms hop (160 samples at 16 kHz)
DEFAULT_SPEECH_TARGET_LEN = 128


def speech_window_frames(config: Any) -> int | None:
    """The frames a Whisper-style encoder requires (its 30 s window: 2 x max_source_positions, after
    the stride-2 convolution); None for encoders that take any length."""
    positions = getattr(config, "max_source_positions", None)
    if getattr(config, "model_type", "") == "whisper" and isinstance(positions, int):
        return 2 * positions
    return None


def speech_workload(config: Any, settings: PlanSettings, warnings: list[str]) -> tuple[Workload, list[str]]:
    s = settings
    window = speech_window_frames(config)
    frames = round(s.audio_seconds * FRAMES_PER_SECOND) if s.audio_seconds is not None else window
    if frames is None:
        raise PlanError(
            f"{getattr(config, 'model_type', 'this model')} has no fixed audio window: pass --audio-seconds"
        )
    if window is not None and frames != window:
        warnings.append(
            f"Whisper's feature extractor pads every clip to the model's {window / FRAMES_PER_SECOND:g} s "
            f"window and its encoder takes nothing else: planned at {window / FRAMES_PER_SECOND:g} s"
        )
        frames = window
    frames = max(1, frames)
    limit = getattr(config, "max_target_positions", None)
    default = min(DEFAULT_SPEECH_TARGET_LEN, limit) if isinstance(limit, int) else DEFAULT_SPEECH_TARGET_LEN
    target = s.target_len or default
    check_shape(s.batch_size, frames, target, None)
    if isinstance(limit, int) and target > limit:
        raise PlanError(f"target length {target} exceeds the model's {limit} decoder positions")
    mel_bins = int(getattr(config, "num_mel_bins", 80) or 80)
    use_cache = bool(getattr(config, "use_cache", False)) if s.use_cache is None else s.use_cache
    padded = True if s.padded is None else s.padded
    workload = Workload(
        task=Task.SPEECH_SEQ2SEQ,
        batch_size=s.batch_size,
        seq_len=None,
        target_len=target,
        image_size=None,
        channels=None,
        padded=padded,
        use_cache=use_cache,
        interpolate_pos_encoding=False,
        audio_frames=frames,
        mel_bins=mel_bins,
    )
    return workload, warnings


def forward_parameters(model_class: type) -> frozenset[str]:
    forward = getattr(model_class, "forward", None)
    if forward is None:
        return frozenset()
    try:
        return frozenset(inspect.signature(forward).parameters)
    except (TypeError, ValueError):
        return frozenset()


def resolve_workload(
    config: Any, task: Task, settings: PlanSettings, forward_params: frozenset[str]
) -> tuple[Workload, list[str]]:
    """The workload of ``settings`` on this model, and warnings for the user. Raises PlanError for
    what the model cannot run (a sequence beyond learned position embeddings, options of another
    task)."""
    check_task_options(settings, task)
    warnings: list[str] = []
    s = settings
    wrong_head = task_warning(config, task)
    if wrong_head:
        warnings.append(wrong_head)
    if task is Task.SPEECH_SEQ2SEQ:
        return speech_workload(config, settings, warnings)
    if task is Task.IMAGE_CLASSIFICATION:
        native = getattr(config, "image_size", None)
        native = native[0] if isinstance(native, (list, tuple)) else native
        size = s.image_size or (native if isinstance(native, int) else None)
        if size is None:
            raise PlanError(f"{type(config).__name__} names no image_size: pass --image-size")
        check_shape(s.batch_size, None, None, size)
        interpolate = (
            isinstance(native, int) and size != native and "interpolate_pos_encoding" in forward_params
        )
        if interpolate:
            warnings.append(
                f"image size {size} differs from the model's {native}: planned with "
                "interpolate_pos_encoding=True, as fine-tuning at another resolution needs"
            )
        return (
            Workload(
                task=task,
                batch_size=s.batch_size,
                seq_len=None,
                target_len=None,
                image_size=size,
                channels=int(getattr(config, "num_channels", 3) or 3),
                padded=False,
                use_cache=False,
                interpolate_pos_encoding=interpolate,
            ),
            warnings,
        )
    seq = s.seq_len or DEFAULT_SEQ_LEN
    target = (s.target_len or seq) if task is Task.SEQ2SEQ_LM else None
    check_shape(s.batch_size, seq, target, None)
    limit = position_limit(config)
    for name, value in (("sequence length", seq), ("target length", target)):
        if limit is None or value is None or value <= limit.max_positions:
            continue
        if limit.hard:
            raise PlanError(f"{name} {value} exceeds the model's {limit.max_positions} position embeddings")
        warnings.append(
            f"{name} {value} is beyond the model's max_position_embeddings ({limit.max_positions}): rotary "
            "positions run, but the model was not trained that long (planned anyway)"
        )
    padded = s.padded if s.padded is not None else "attention_mask" in forward_params
    if padded and "attention_mask" not in forward_params:
        raise PlanError("this model's forward takes no attention_mask: plan it with --no-padding")
    use_cache = bool(getattr(config, "use_cache", False)) if s.use_cache is None else s.use_cache
    return (
        Workload(
            task=task,
            batch_size=s.batch_size,
            seq_len=seq,
            target_len=target,
            image_size=None,
            channels=None,
            padded=padded,
            use_cache=use_cache,
            interpolate_pos_encoding=False,
        ),
        warnings,
    )
