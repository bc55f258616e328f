"""A GGUF file's weights priced at its own per-tensor ggml types: the storage format `memory FILE.gguf` uses.

Each parameter of the class built from the file's metadata is the GGUF tensor(s) gguf_names.py maps it to, and costs
exactly their bytes (elements / block size × type size, from the header), whatever mixture the file holds (Q4_K_M's
Q6_K attn_v and output, F32 norms, ...). Nothing is estimated: a parameter the file does not hold is refused.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..cost.memory.quantization import TensorBytes, WeightFormat
from ..errors import CheckpointError, UnsupportedError
from .gguf_names import stored_gguf_names
from .gguf_read import GGUFCheckpoint

# ggml types that hold values as plain floats: a parameter stored so is not quantised.
_FLOATS = frozenset({"F32", "F16", "BF16", "F64"})


@dataclass(frozen=True)
class GGUFFileFormat(WeightFormat):
    """WeightFormat whose bytes are the file's, parameter by parameter (memory/weights.py asks `stored_bytes`)."""

    checkpoint: GGUFCheckpoint | None = field(default=None, compare=False, repr=False)
    layers: int = 0

    def __post_init__(self) -> None:
        tensors = self.checkpoint.tensors if self.checkpoint is not None else ()
        object.__setattr__(self, "_by_name", {t.name: t for t in tensors})  # looked up per parameter

    def _tensors(self, name: str, aliases: tuple[str, ...] = ()) -> list[Any]:
        ck = self.checkpoint
        by_name = self._by_name
        for candidate in (name, *aliases):
            for names in stored_gguf_names(ck.architecture or "", self.layers, candidate):
                if all(n in by_name for n in names):
                    return [by_name[n] for n in names]
        raise CheckpointError(f"{ck.path}: cannot price {name} at the file's types: the file holds no tensor for it "
                              f"(`paramscope audit {ck.path}` shows how the file and the class differ)")

    def stored_bytes(self, param: Any) -> TensorBytes:
        """The exact bytes of the GGUF tensor(s) holding `param` (count.ParameterInfo), with their types."""
        import gguf

        tensors = self._tensors(param.name, tuple(param.aliases))
        types = sorted({t.ggml_type for t in tensors})
        whole = sum(t.elements for t in tensors)
        parts, total = [], 0
        for t in tensors:
            block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[t.ggml_type]]
            # a tensor-parallel rank's slice (parallel/serving.py) holds its share of each tensor, whole blocks
            share, rest = divmod(t.elements * param.numel, whole)
            last = param.shape[-1] if param.shape else 1
            if rest or share % block or (len(param.shape) > 1 and last % block and param.numel != whole):
                raise UnsupportedError(f"{param.name}: a slice of {param.numel:,} of its {whole:,} values is no "
                                       f"whole number of {t.ggml_type} blocks of {block}; give {{0}} to price the "
                                       "slices in one type", "dtype")
            total += share // block * size
            parts.append(f"{share // block:,} blocks of {block} × {size} B" if block > 1 else f"{share:,} × {size} B")
        return TensorBytes(total, 0, "+".join(types).lower(), " + ".join(parts))

    def quantized_names(self, params: Any) -> frozenset[str]:
        """The parameters the file stores in a block-quantised ggml type (not F32/F16/BF16)."""
        return frozenset(p.name for p in params
                         if any(t.ggml_type not in _FLOATS for t in self._tensors(p.name, tuple(p.aliases))))

    def tensor_bytes(self, shape: tuple[int, ...]) -> TensorBytes:
        raise UnsupportedError("a GGUF file's own ggml types price its tensors by name, not a bare shape; give {0} "
                               "(q4_k, q8_0, ...) to price shapes in one type", "dtype")


def gguf_file_format(ck: GGUFCheckpoint, layers: int) -> GGUFFileFormat:
    """The format of the file `ck`: its own types per tensor, the rest (KV cache, workspace) in f32 as llama.cpp's
    other GGUF formats here compute (the KV cache f16, llama.cpp's default --cache-type-k/v)."""
    types = ", ".join(f"{k} {v['bits_per_weight']:.2f}" for k, v in ck.by_type().items())
    bpw = ck.bits_per_weight
    rope = next((t for t in ck.tensors if t.name == "rope_freqs.weight"), None)
    # llama.cpp's rope factors are no parameter of the class: its rotary buffer (counted with the buffers) holds them
    extra = f"; its rope_freqs ({rope.nbytes:,} B) is the class's rotary buffer here" if rope is not None else ""
    return GGUFFileFormat(
        key="gguf-file", kind="gguf",
        label=f"the GGUF file's own ggml types, tensor by tensor ({bpw:.2f} bits per weight overall; {types} bits "
              f"per weight), exact bytes from its header{extra}",
        compute_dtype="float32", targets="matrices", checkpoint=ck, layers=layers)
