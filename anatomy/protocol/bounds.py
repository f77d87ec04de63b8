"""The wire's bounds: how long a line, how large a number, a message may carry; and the error for
anything that breaks them. Stdlib only.

Physical bounds are checked at decode so that no view ever formats a number it cannot hold (a valid JSON
integer may have 4,300 digits; 1e309 would overflow every float conversion downstream).
"""

from __future__ import annotations

WEIGHT_QUANTIZATIONS = frozenset({"nf4", "fp4", "int8"})
MAX_OTHER_MODELS = 32  # named other models in a hello (a teacher, a reference model, an EMA copy ...)
MAX_MODEL_NAME = 128
MAX_MESSAGE_BYTES = 256 * 1024
MAX_INT = 2**62
MAX_BYTES = 2**56  # 64 PiB: more memory than any process holds
MAX_FLOAT = 1e30
MAX_SECONDS = 1e7  # a step, a phase, an op group: under four months
MAX_EPOCH_S = 1e11  # a wall-clock time: before the year 5000
MAX_RATE = 1e15  # samples or tokens per second
MAX_TFLOPS = 1e9
MAX_MFU = 10.0  # a ratio; above 1 only when a GPU's peak is mis-tabled, never 10x
MAX_BYTES_PER_PARAM = 1e6
MAX_SPEED_FACTOR = 1e3
MAX_CONFIG_CHARS = 32 * 1024  # a hello's model_config: a large config (id2label of 20k labels) is left out
MAX_BATCH_DIMS = 8
MAX_LORA_RANK = 1 << 16  # a hello's LoRA adapter: rank r (PEFT's are 4 to 256)
MAX_LORA_TARGETS = 64  # target module names in a hello's LoRA adapter
MAX_STRING_CHARS = 4096  # any other string field
MAX_SUGGESTIONS = 64


class ProtocolError(ValueError):
    """A message that is malformed, oversize, of another protocol version, or fails validation."""
