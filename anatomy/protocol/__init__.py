"""The wire protocol between the training-side hook and the monitor. Stdlib only.

Transport: one Unix domain stream socket per training process, in a private runtime directory.
Framing: newline-delimited JSON, one object per line, at most MAX_MESSAGE_BYTES per line.
The server (the hook) sends a ``hello`` first, then ``snapshot`` messages (latest only, at most one
per publish interval). Readers send nothing; anything a reader sends is ignored.

Version rule: a reader accepts a message whose ``protocol`` is one of READABLE_VERSIONS and
ignores fields it does not know; a new required field means a new version. Version 2 added the
optional components (runtime, unsharded_parameters, inputs, communication_buffers) and the hello's
``run_id``/``local_world_size``; a version 1 message is a valid version 2 message. Version 3 added the
``other_models`` component (a reader of version 2 would reject the unknown component name, so it refuses
the version instead) and the optional ``trainable_parameter_count``, ``weight_quantization`` and
``other_models`` hello fields; a version 1 or 2 message is a valid version 3 message. Optional hello fields
added since, without a version change (a reader ignores them): ``model_config``, ``batch_shape``,
``target_shape`` and ``lora`` (for ``anatomy-top plan --like``).

The package's rooms: :mod:`~anatomy.protocol.messages` (the dataclasses), :mod:`~anatomy.protocol.bounds`
(limits and ProtocolError), :mod:`~anatomy.protocol.codec` (encode, decode, validation),
:mod:`~anatomy.protocol.discovery` (file names, live sockets, file identity), :mod:`~anatomy.protocol.reader`
(the monitor's reader, peer credentials), :mod:`~anatomy.protocol.oom` (the out-of-memory file), and
:mod:`~anatomy.protocol.publisher` (the hook's server, imported on its own: the monitor never needs it).
The package imports nothing of ours but :mod:`anatomy.vocabulary` and :mod:`anatomy.rundir`.
"""

from __future__ import annotations

from anatomy.protocol.bounds import (
    MAX_BATCH_DIMS,
    MAX_BYTES,
    MAX_BYTES_PER_PARAM,
    MAX_CONFIG_CHARS,
    MAX_EPOCH_S,
    MAX_FLOAT,
    MAX_INT,
    MAX_LORA_RANK,
    MAX_LORA_TARGETS,
    MAX_MESSAGE_BYTES,
    MAX_MFU,
    MAX_MODEL_NAME,
    MAX_OTHER_MODELS,
    MAX_RATE,
    MAX_SECONDS,
    MAX_SPEED_FACTOR,
    MAX_TFLOPS,
    WEIGHT_QUANTIZATIONS,
    ProtocolError,
)
from anatomy.protocol.codec import decode, encode, from_dict, to_dict
from anatomy.protocol.discovery import (
    OOM_SUFFIX,
    SOCKET_SUFFIX,
    FileIdentity,
    discover,
    discover_oom,
    file_identity,
    oom_path,
    pid_alive,
    pid_from_path,
    runtime_dir,
    socket_name,
    untrusted_reason,
)
from anatomy.protocol.messages import (
    PROTOCOL_VERSION,
    READABLE_VERSIONS,
    Busy,
    CudaMemory,
    Hello,
    LoraAdapter,
    Message,
    OpGroupStat,
    Snapshot,
    Suggestion,
    Timing,
)
from anatomy.protocol.oom import read_oom_file, read_small_file, write_oom_file
from anatomy.protocol.reader import POLL_BUDGET_BYTES, POLL_BUDGET_S, Peer, Reader, peer_of

__all__ = [
    "MAX_BATCH_DIMS",
    "MAX_BYTES",
    "MAX_BYTES_PER_PARAM",
    "MAX_CONFIG_CHARS",
    "MAX_EPOCH_S",
    "MAX_FLOAT",
    "MAX_INT",
    "MAX_LORA_RANK",
    "MAX_LORA_TARGETS",
    "MAX_MESSAGE_BYTES",
    "MAX_MFU",
    "MAX_MODEL_NAME",
    "MAX_OTHER_MODELS",
    "MAX_RATE",
    "MAX_SECONDS",
    "MAX_SPEED_FACTOR",
    "MAX_TFLOPS",
    "OOM_SUFFIX",
    "POLL_BUDGET_BYTES",
    "POLL_BUDGET_S",
    "PROTOCOL_VERSION",
    "READABLE_VERSIONS",
    "SOCKET_SUFFIX",
    "WEIGHT_QUANTIZATIONS",
    "Busy",
    "CudaMemory",
    "FileIdentity",
    "Hello",
    "LoraAdapter",
    "Message",
    "OpGroupStat",
    "Peer",
    "ProtocolError",
    "Reader",
    "Snapshot",
    "Suggestion",
    "Timing",
    "decode",
    "discover",
    "discover_oom",
    "encode",
    "file_identity",
    "from_dict",
    "oom_path",
    "peer_of",
    "pid_alive",
    "pid_from_path",
    "read_oom_file",
    "read_small_file",
    "runtime_dir",
    "socket_name",
    "to_dict",
    "untrusted_reason",
    "write_oom_file",
]
