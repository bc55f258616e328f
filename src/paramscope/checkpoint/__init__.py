"""Auditing a real checkpoint by reading its headers only, then reconciling it with a model: the public names.

Three jobs, all pure functions over frozen dataclasses, none importing torch:

* `read_checkpoint(path)` (read.py) lists every tensor (name, dtype, shape, bytes) of a safetensors file, a sharded
  checkpoint, a folder or a zip-format PyTorch ``.bin``, without reading tensor data and without allocating
  anything whose size comes from the file before that size has been checked against the file itself;
  `read_hub_checkpoint` does the same from a hub repo's safetensors headers. A ``.bin`` is a pickle; it is never
  handed to a normal unpickler: unpickler.py's restricted one knows only the handful of globals that rebuild
  tensors, and those rebuild nothing but (dtype, shape) records. What the headers describe is tensors.py's data
  model; quantisation.py marks packed weights and quantisation bookkeeping by name and shape (bitsandbytes,
  GPTQ/AWQ, fp8 scales, compressed-tensors; counts that live in tensor data, such as bnb quant_state, are not read).
* `read_gguf(path)` (gguf_read.py) reads a GGUF file, shard set or folder from its header alone, with the same
  bounds: ggml types, exact bytes, metadata, unpacked counts and bits per weight by type and role.
* `reconcile(checkpoint, expected_params, ...)` (loading.py) maps checkpoint keys onto a model's parameter names the
  way transformers 5 does when loading and says what would be missing, unused, mismatched, or not a parameter.

Anything wrong with a file raises CheckpointError naming the file and the problem; a path that does not exist or
cannot be opened raises SourceError.
"""

from __future__ import annotations

from .gguf_read import GGUFCheckpoint, GGUFTensor, read_gguf
from .loading import Audit, Finding, Mismatch, reconcile
from .read import checkpoint_from_hub_metadata, read_checkpoint, read_hub_checkpoint
from .tensors import SAFETENSORS_DTYPE_BITS, Checkpoint, CheckpointTensor

__all__ = [
    "Audit",
    "Checkpoint",
    "CheckpointTensor",
    "Finding",
    "GGUFCheckpoint",
    "GGUFTensor",
    "Mismatch",
    "SAFETENSORS_DTYPE_BITS",
    "checkpoint_from_hub_metadata",
    "read_checkpoint",
    "read_gguf",
    "read_hub_checkpoint",
    "reconcile",
]
