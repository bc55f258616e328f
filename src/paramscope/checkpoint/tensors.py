"""What a checkpoint holds, as its headers describe it: the dtypes' sizes, each tensor (`CheckpointTensor`) and
the whole checkpoint (`Checkpoint`), frozen; no tensor data is ever read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType
from typing import Any, Iterable, Mapping

from ..frozen import FrozenDict, freeze, freeze_fields, thaw

# Bits per element of every dtype the safetensors format defines (safetensors 0.8 knows these 22).
# Sub-byte types (F4, F6_*) are why sizes are computed in bits: a tensor must still fill whole bytes.
SAFETENSORS_DTYPE_BITS: Mapping[str, int] = MappingProxyType({
    "BOOL": 8,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E8M0": 8,
    "F8_E4M3FNUZ": 8,
    "F8_E5M2FNUZ": 8,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "C64": 64,
    "F64": 64,
    "I64": 64,
    "U64": 64,
})
# torch can store one dtype safetensors cannot; it only ever appears in .bin files.
DTYPE_BITS: Mapping[str, int] = {**SAFETENSORS_DTYPE_BITS, "C128": 128}


@dataclass(frozen=True, slots=True)
class CheckpointTensor:
    """One tensor as its file describes it. No data is ever read.

    `numel` and `nbytes` are what is stored. For a packed quantised tensor (`role == "packed"`)
    `logical_numel` is how many weight values it holds, or None when the header alone cannot tell;
    for every other tensor it equals `numel`. `role == "quant_aux"` marks scales, zero points and
    quantisation state: stored tensors that are not model parameters.
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    numel: int
    nbytes: int
    file: str
    role: str = "tensor"  # tensor | packed | quant_aux
    logical_numel: int | None = None
    packing: str = ""  # "" | bnb-4bit | bnb-8bit | gptq | fp8 | compressed-tensors
    note: str = ""

    def __post_init__(self) -> None:
        if self.role != "packed" and self.logical_numel is None:
            object.__setattr__(self, "logical_numel", self.numel)


@dataclass(frozen=True)
class Checkpoint:
    """Every tensor of a checkpoint (all shards), sorted by name."""

    path: str
    format: str  # safetensors | safetensors-sharded | pytorch-bin | pytorch-bin-sharded
    tensors: tuple[CheckpointTensor, ...]
    metadata: FrozenDict[str, Any] = field(default_factory=FrozenDict, compare=False)

    def __post_init__(self) -> None:
        freeze_fields(self, "metadata")

    @cached_property  # a checkpoint may hold a million tensors; each figure is summed once
    def elements(self) -> int:
        """Stored elements over all tensors (packed tensors count their storage elements)."""
        return sum(t.numel for t in self.tensors)

    @cached_property
    def nbytes(self) -> int:
        """Bytes of tensor data the headers describe (numel x itemsize, summed)."""
        return sum(t.nbytes for t in self.tensors)

    @cached_property
    def by_dtype(self) -> FrozenDict[str, FrozenDict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for t in self.tensors:
            row = out.setdefault(t.dtype, {"tensors": 0, "elements": 0, "bytes": 0})
            row["tensors"] += 1
            row["elements"] += t.numel
            row["bytes"] += t.nbytes
        return freeze({k: out[k] for k in sorted(out)})

    @cached_property
    def files(self) -> tuple[str, ...]:
        seen: dict[str, None] = {}
        for t in self.tensors:
            seen.setdefault(t.file, None)
        return tuple(seen)

    def tensor(self, name: str) -> CheckpointTensor:
        for t in self.tensors:
            if t.name == name:
                return t
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "format": self.format,
            "tensors": len(self.tensors),
            "elements": self.elements,
            "bytes": self.nbytes,
            "by_dtype": thaw(self.by_dtype),
            "files": list(self.files),
            "metadata": thaw(self.metadata),
        }


def bounded_prod(dims: Iterable[int], limit: int) -> int | None:
    """The product of `dims`, or None as soon as it exceeds `limit` (a zero anywhere gives 0)."""
    dims = list(dims)
    if 0 in dims:
        return 0
    product = 1
    for d in dims:
        product *= d
        if product > limit:
            return None
    return product
