"""What a checkpoint holds, as its headers describe it: the dtypes' sizes, each tensor (`CheckpointTensor`) and
the whole checkpoint (`Checkpoint`), frozen; no tensor data is ever read.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from functools import cached_property
from operator import attrgetter
from types import MappingProxyType
from typing import Any, Iterable, Mapping

from ..frozen import FrozenDict, freeze, freeze_fields, thaw

# At most this many tensors in one checkpoint, every shard together. The largest real checkpoints hold a few hundred
# thousand (DeepSeek-V3's fp8 experts and their scales: about 92,000; a 384-expert MoE in bitsandbytes 4-bit, with
# its state tensors: about 400,000). A header under the 100 MB cap can list 1.9 million zero-size tensors, and
# shards multiply that; past the bound a checkpoint is refused while its header is parsed, so that every audit
# answers within seconds and a GiB.
# (here, beside the tensors, so that every reader — safetensors, torch, GGUF — takes it without importing another)
MAX_TENSORS = 1_000_000

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


class _Filling:
    """CheckpointTensor's slots, in its order, settable: `make_tensor` fills one and then makes it the frozen
    CheckpointTensor it equals (the layouts are the same, so `__class__` may be assigned). A frozen dataclass sets each
    field through object.__setattr__, 3 µs a tensor here, and a 100 MB header lists a million tensors."""

    __slots__ = CheckpointTensor.__slots__  # type: ignore[attr-defined]

    def __init__(self, name: str, dtype: str, shape: tuple[int, ...], numel: int, nbytes: int, file: str,
                 role: str = "tensor", logical_numel: int | None = None, packing: str = "", note: str = "") -> None:
        self.name = name
        self.dtype = dtype
        self.shape = shape
        self.numel = numel
        self.nbytes = nbytes
        self.file = file
        self.role = role
        self.logical_numel = numel if logical_numel is None and role != "packed" else logical_numel  # __post_init__
        self.packing = packing
        self.note = note
        self.__class__ = CheckpointTensor  # type: ignore[assignment]


make_tensor: Any = _Filling
"""`CheckpointTensor(...)`, the same arguments and an equal tensor in every way, four times faster."""

try:  # where `__class__` cannot be assigned (another Python), the dataclass's own constructor
    if (make_tensor("t", "F32", (1,), 1, 4, "f") != CheckpointTensor("t", "F32", (1,), 1, 4, "f")
            or type(make_tensor("t", "F32", (1,), 1, 4, "f")) is not CheckpointTensor):
        raise TypeError("make_tensor differs")
except TypeError:
    make_tensor = CheckpointTensor


@dataclass(frozen=True)
class Checkpoint:
    """Every tensor of a checkpoint (all shards), sorted by name."""

    path: str
    format: str  # safetensors | safetensors-sharded | pytorch-bin | pytorch-bin-sharded
    tensors: tuple[CheckpointTensor, ...]
    metadata: FrozenDict[str, Any] = field(default_factory=FrozenDict, compare=False)

    def __post_init__(self) -> None:
        freeze_fields(self, "metadata")

    # A checkpoint may hold a million tensors: each figure is summed once, by C loops (map, Counter) over them.
    @cached_property
    def elements(self) -> int:
        """Stored elements over all tensors (packed tensors count their storage elements)."""
        return sum(map(_numel, self.tensors))

    @cached_property
    def nbytes(self) -> int:
        """Bytes of tensor data the headers describe (numel x itemsize, summed)."""
        return sum(map(_nbytes, self.tensors))

    @cached_property
    def by_dtype(self) -> FrozenDict[str, FrozenDict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        # Tensors counted by (dtype, numel, bytes): a few distinct triples, however many tensors.
        for (dtype, numel, nbytes), times in Counter(map(_sizes, self.tensors)).items():
            row = out.setdefault(dtype, {"tensors": 0, "elements": 0, "bytes": 0})
            row["tensors"] += times
            row["elements"] += numel * times
            row["bytes"] += nbytes * times
        return freeze({k: out[k] for k in sorted(out)})

    @cached_property
    def files(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(map(_file, self.tensors)))

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


_numel, _nbytes, _file = attrgetter("numel"), attrgetter("nbytes"), attrgetter("file")
_sizes = attrgetter("dtype", "numel", "nbytes")


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
