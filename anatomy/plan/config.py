"""Reading a transformers config: where it comes from, which task it trains, how deep it is.

Nothing here builds a model; transformers is imported only to load a config or read its task
tables.
"""

from __future__ import annotations

import contextlib
import copy
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from anatomy.plan.settings import PlanError, Task


def load_config(model: str) -> Any:
    """A transformers config from a directory holding config.json, a config.json path, or a hub id."""
    from transformers import AutoConfig

    path = Path(model).expanduser()
    try:
        if path.is_dir():
            if not (path / "config.json").is_file():
                raise PlanError(f"{model}: directory has no config.json")
            return AutoConfig.from_pretrained(str(path))
        if path.is_file():
            return AutoConfig.from_pretrained(str(path))
    except PlanError:
        raise
    except Exception as exc:
        raise PlanError(f"{model}: not a usable transformers config ({type(exc).__name__}: {exc})") from None
    if path.suffix == ".json" or model.startswith((".", "/", "~")):
        raise PlanError(f"{model}: no such file")
    with contextlib.suppress(Exception):  # a hub config already in the local cache
        return AutoConfig.from_pretrained(model, local_files_only=True)
    try:
        if not hub_reachable():
            raise OSError("the hub is not reachable from here")
        return AutoConfig.from_pretrained(model)
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise PlanError(
            f"{model}: not a local directory or config.json, and the Hugging Face hub did not provide it "
            f"(offline or unknown id: {first[:200]}). "
            "Pass a directory with config.json or a config.json path."
        ) from None


def hub_reachable(timeout: float = 2.0) -> bool:
    """A quick TCP check of the Hugging Face endpoint, so an offline machine fails in seconds rather
    than after the hub client's retries."""
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
        return False
    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    host, port = url.hostname or "huggingface.co", url.port or (80 if url.scheme == "http" else 443)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def default_task(config: Any) -> Task:
    """The task ``config.architectures`` names; else the one its model type supports."""
    encoder_decoder = bool(getattr(config, "is_encoder_decoder", False))
    if encoder_decoder and is_speech(config):
        return Task.SPEECH_SEQ2SEQ  # Whisper's own architectures name no task word we could read
    for arch in (a.lower() for a in (getattr(config, "architectures", None) or [])):
        if "forimageclassification" in arch:
            return Task.IMAGE_CLASSIFICATION
        if encoder_decoder and ("forconditionalgeneration" in arch or "seq2seq" in arch):
            return Task.SEQ2SEQ_LM
        if "forcausallm" in arch or "lmheadmodel" in arch:
            return Task.CAUSAL_LM
        if "formaskedlm" in arch or "forpretraining" in arch:
            return Task.MASKED_LM
        if "forsequenceclassification" in arch:
            return Task.SEQUENCE_CLASSIFICATION
    from transformers.models.auto import modeling_auto as auto

    model_type = getattr(config, "model_type", "")
    if encoder_decoder and model_type in auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES:
        return Task.SEQ2SEQ_LM
    if model_type in auto.MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES and not hasattr(config, "vocab_size"):
        return Task.IMAGE_CLASSIFICATION
    if (
        model_type in auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
        and model_type not in auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES
    ):
        return Task.CAUSAL_LM
    return Task.SEQUENCE_CLASSIFICATION  # the guide's example: BERT with a classification head


def is_speech(config: Any) -> bool:
    """A speech encoder-decoder (Whisper, Speech2Text, ...): its encoder takes audio features."""
    from transformers.models.auto import modeling_auto as auto

    return getattr(config, "model_type", "") in auto.MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES


def task_warning(config: Any, task: Task) -> str | None:
    """A head that trains another model than the config's users train: an encoder-decoder planned as
    a causal LM has no encoder (WhisperForCausalLM is Whisper's text decoder alone)."""
    if task is Task.CAUSAL_LM and getattr(config, "is_encoder_decoder", False):
        right = Task.SPEECH_SEQ2SEQ if is_speech(config) else Task.SEQ2SEQ_LM
        return (
            f"{getattr(config, 'model_type', 'this model')} is an encoder-decoder: causal-lm plans its "
            f"decoder alone (no encoder, no {'audio features' if is_speech(config) else 'source tokens'}); "
            f"the model users train is planned with --task {right.value}"
        )
    return None


# ---------------------------------------------------------------------------------------------
# Depth


@dataclass(frozen=True)
class DepthAxis:
    """One stack of identical layers the plan may extrapolate along: its config attribute, its depth,
    and how many layers repeat (1, or the period of ``config.layer_types``)."""

    attr: str
    depth: int
    period: int = 1


def layer_period(config: Any) -> int:
    """How many layers repeat (1 for identical layers; e.g. 2 for alternating sliding/global attention,
    from ``config.layer_types``)."""
    types = getattr(config, "layer_types", None)
    if not isinstance(types, list) or not types:
        return 1
    for period in range(1, len(types) + 1):
        if all(types[i] == types[i % period] for i in range(len(types))):
            return period
    return len(types)


def _int_attr(config: Any, name: str) -> int | None:
    value = getattr(config, name, None)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def depth_axes(config: Any) -> tuple[DepthAxis, ...]:
    """The layer stacks of ``config``: encoder and decoder of a seq2seq model, the one stack of a
    decoder or encoder model; none for models whose depth is a list of stages (ConvNeXt, Swin), which
    are always run at full depth."""
    if isinstance(getattr(config, "depths", None), (list, tuple)):
        return ()
    if getattr(config, "is_encoder_decoder", False):
        for enc, dec in (("encoder_layers", "decoder_layers"), ("num_layers", "num_decoder_layers")):
            e, d = _int_attr(config, enc), _int_attr(config, dec)
            if e is not None and d is not None:
                return (DepthAxis(enc, e), DepthAxis(dec, d))
        return ()
    for attr in ("num_hidden_layers", "n_layer", "num_layers"):
        depth = _int_attr(config, attr)
        if depth is not None:
            return (DepthAxis(attr, depth, layer_period(config)),)
    return ()


def num_layers(config: Any) -> int | None:
    """Layers of all stacks together (None: unknown)."""
    axes = depth_axes(config)
    if axes:
        return sum(a.depth for a in axes)
    depths = getattr(config, "depths", None)
    if isinstance(depths, (list, tuple)) and all(isinstance(d, int) for d in depths):
        return sum(depths)
    return None


def with_depths(config: Any, depths: dict[str, int]) -> Any:
    """A copy of ``config`` with the given stacks cut to the given depths (``layer_types`` with them)."""
    cfg = copy.deepcopy(config)
    for attr, depth in depths.items():
        setattr(cfg, attr, depth)
        if attr in ("num_hidden_layers", "n_layer", "num_layers") and not getattr(
            cfg, "is_encoder_decoder", 0
        ):
            layer_types = getattr(cfg, "layer_types", None)
            if isinstance(layer_types, list) and layer_types:
                cfg.layer_types = layer_types[:depth]
    return cfg


# ---------------------------------------------------------------------------------------------
# Positions


@dataclass(frozen=True)
class PositionLimit:
    """The longest sequence a config's positions cover, and whether going beyond it fails (learned
    position embeddings) or only leaves what the model was trained on (rotary positions)."""

    max_positions: int
    hard: bool


def position_limit(config: Any) -> PositionLimit | None:
    max_pos = _int_attr(config, "max_position_embeddings") or _int_attr(config, "n_positions")
    if max_pos is None:
        return None  # relative positions (T5) or none at all
    rope = any(hasattr(config, a) for a in ("rope_theta", "rope_parameters", "rope_scaling"))
    return PositionLimit(max_pos, hard=not rope)
