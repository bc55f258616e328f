"""A compressed-tensors quantization_config priced as the checkpoint stores it: the storage format memory uses.

Which linear layers are quantised, and in which config group, is the audit's reading of the config
(checkpoint/packed.py's `DeclaredQuantization`: `config_groups` targets, "re:" regexes and exact names, then the first group
that targets a class; `ignore` as compressed-tensors matches it). Each quantised weight [out, in] costs the tensors
compressed-tensors writes for it, the layouts packed.py reads back (its module docstring):

- pack-quantized (int, 1-8 bits): `weight_packed` I32 [out, ⌈in·b/32⌉], `weight_shape` I64 [2], and when
  asymmetric `weight_zero_point` I32 [⌈rows·b/32⌉, cols] over the scale's [rows, cols];
- int-quantized / float-quantized / naive-quantized: `weight` at one byte a value (int8, fp8), and when asymmetric
  a zero point a scale (int8);
- nvfp4-pack-quantized: `weight_packed` U8 [out, in/2], `weight_scale` F8_E4M3 [out, in/16],
  `weight_global_scale` F32 [1]; mxfp4-pack-quantized: U8 [out, in/2] and U8 (e8m0) scales [out, in/32];
- `weight_scale` by strategy: tensor [1], channel [out, 1], group / tensor_group [out, ⌈in/g⌉], block
  [⌈out/bo⌉, ⌈in/bi⌉]; in the group's `scale_dtype` where it names one, else fp8 for fp4 weights and the model's
  dtype otherwise (compressed-tensors' initialize_qparams);
- `weight_g_idx` I32 [in] under group activation order; static input activations add `input_scale` (one a
  tensor) or, for fp4, `input_global_scale` F32 [1].

A scheme outside these (another format, a sparse compressor, a strategy with no weight layout) is refused in one
line naming it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ...errors import UnsupportedError, short_repr
from ..dtypes import DTYPE_NAMES, itemsize, short_name
from .quantization import TensorBytes, WeightFormat

_PACKED_INT = "pack-quantized"
_ONE_BYTE = ("int-quantized", "float-quantized", "naive-quantized")
_FP4 = {"nvfp4-pack-quantized": (16, 1, "F8_E4M3"), "mxfp4-pack-quantized": (32, 1, "U8 e8m0")}


@dataclass(frozen=True)
class _Scheme:
    """One config group's weights, as stored."""

    format: str
    bits: int
    type: str
    strategy: str
    group: int | None
    block: tuple[int, int] | None
    symmetric: bool
    scale_size: int  # bytes of one scale
    zero_size: int  # bytes of one (unpacked) zero point
    g_idx: bool
    input_bytes: int  # static input-activation scales a layer stores


def _dtype_size(value: Any, default: int) -> int:
    if not isinstance(value, str):
        return default
    dtype = DTYPE_NAMES.get(value.removeprefix("torch.").lower())
    return itemsize(dtype) if dtype else default


def _scheme(config: dict[str, Any], name: str, group: dict[str, Any], compute: str) -> _Scheme:
    w = group.get("weights") if isinstance(group.get("weights"), dict) else {}
    fmt = group.get("format") or config.get("format") or ""
    bits, kind = w.get("num_bits", 8), str(w.get("type") or "int")
    strategy = str(w.get("strategy") or "tensor")
    size, block = w.get("group_size"), w.get("block_structure")

    def refuse(what: str) -> UnsupportedError:
        return UnsupportedError(f"the config's compressed-tensors {name} ({what}) is a scheme paramscope's memory "
                                "does not model; choose a storage with {0}", "dtype")

    if fmt not in (_PACKED_INT, *_ONE_BYTE, *_FP4):
        raise refuse(f"format {short_repr(fmt)}")
    if type(bits) is not int or not 1 <= bits <= 8 or kind not in ("int", "float"):
        raise refuse(f"{short_repr(kind)}{short_repr(bits)} weights")
    if strategy not in ("tensor", "channel", "group", "tensor_group", "block"):
        raise refuse(f"strategy {short_repr(strategy)}")
    if strategy in ("group", "tensor_group") and not (type(size) is int and size > 0):
        raise refuse(f"strategy {strategy} with group_size {short_repr(size)}")
    if strategy == "block" and not (isinstance(block, list) and len(block) == 2
                                    and all(type(b) is int and b > 0 for b in block)):
        raise refuse(f"strategy block with block_structure {short_repr(block)}")
    if fmt in _FP4 and (bits, kind, size) != (4, "float", _FP4[fmt][0]):
        raise refuse(f"{fmt} with {kind}{bits} group {short_repr(size)}")
    if fmt in _ONE_BYTE and bits != 8:
        raise refuse(f"{fmt} at {bits} bits")
    fp4 = bits == 4 and kind == "float"
    scale_size = _dtype_size(w.get("scale_dtype"), 1 if fp4 else itemsize(compute))
    zero_size = _dtype_size(w.get("zp_dtype"), 1)
    actorder = w.get("actorder")
    inputs = group.get("input_activations")
    input_bytes = 0
    if isinstance(inputs, dict) and inputs.get("dynamic") is not True:
        in_strategy = inputs.get("strategy") or "tensor"
        if in_strategy == "tensor_group":  # fp4 inputs: a per-layer global scale, the local ones computed
            input_bytes = 4
        elif in_strategy == "tensor" and inputs.get("dynamic") in (False, None):
            input_bytes = _dtype_size(inputs.get("scale_dtype"), itemsize(compute))
        elif inputs.get("dynamic") not in ("local",):
            raise refuse(f"static input activations by {short_repr(in_strategy)}")
    return _Scheme(fmt, bits, kind, strategy, size if strategy in ("group", "tensor_group") else None,
                   (block[0], block[1]) if strategy == "block" else None, w.get("symmetric", True) is not False,
                   scale_size, zero_size, actorder in ("group", True), input_bytes)


def _scales(s: _Scheme, out: int, cols: int) -> tuple[int, int]:
    if s.strategy == "tensor":
        return 1, 1
    if s.strategy == "channel":
        return out, 1
    if s.block is not None:
        return -(-out // s.block[0]), -(-cols // s.block[1])
    return out, -(-cols // s.group)


def scheme_bytes(s: _Scheme, shape: tuple[int, ...]) -> TensorBytes:
    """The bytes compressed-tensors stores for one [out, in] weight in scheme `s`."""
    out, cols = (shape[0], shape[-1]) if len(shape) == 2 else (math.prod(shape[:-1]), shape[-1])
    rows, per_row = _scales(s, out, cols)
    scales = rows * per_row
    overhead = scales * s.scale_size + s.input_bytes
    parts = [f"{scales:,} scales × {s.scale_size}"]
    if s.format in _FP4:
        data = -(-cols // 2) * out
        text = f"{out:,} × {cols:,} / 2"
        if s.format.startswith("nv"):
            overhead += 4
            parts.append("4 (global scale)")
    elif s.format == _PACKED_INT:
        data = -(-cols * s.bits // 32) * 4 * out
        text = f"{out:,} × ⌈{cols:,}·{s.bits}/32⌉ × 4"
        overhead += 16
        parts.append("16 (weight_shape)")
        if not s.symmetric:
            zeros = -(-rows * s.bits // 32) * per_row * 4
            overhead += zeros
            parts.append(f"{zeros:,} (packed zero points)")
    else:
        data = out * cols
        text = f"{out * cols:,} × 1"
        if not s.symmetric:
            overhead += scales * s.zero_size
            parts.append(f"{scales:,} zero points × {s.zero_size}")
    if s.g_idx:
        overhead += cols * 4
        parts.append(f"{cols:,} × 4 (g_idx)")
    if s.input_bytes:
        parts.append(f"{s.input_bytes} (input scale)")
    width = f"{s.type}{s.bits}"
    return TensorBytes(data, overhead, f"{width} ({s.format})", f"{text} + " + " + ".join(parts))


@dataclass(frozen=True)
class CompressedTensorsFormat(WeightFormat):
    """WeightFormat whose quantised weights follow the config's groups and ignore list (memory/weights.py asks
    `select` which linears it quantises and `named_bytes` what each costs)."""

    config: Any = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        from ...checkpoint.packed import DeclaredQuantization

        expected = DeclaredQuantization(self.config)
        schemes = {name: _scheme(self.config, name, g, self.compute_dtype) for name, g in expected.groups}
        object.__setattr__(self, "_expected", expected)
        object.__setattr__(self, "_schemes", schemes)

    def _scheme_of(self, module: str) -> _Scheme | None:
        if self._expected.listed(module):
            return None
        group = self._expected.group(module)
        return None if group is None else self._schemes[group[0]]

    def select(self, params: Any, linear_modules: Any) -> frozenset[str]:
        """The weights of the linear layers a config group targets and `ignore` does not name."""
        names = {p.name for p in params}
        fused = next((p.name for p in params if len(p.shape) >= 3
                      and self._scheme_of(p.name.rpartition(".")[0]) is not None), None)
        if fused is not None:  # compressed-tensors writes experts as linears; this class fuses them into one tensor
            raise UnsupportedError(f"{fused}: a fused expert tensor, which the config's compressed-tensors groups "
                                   "would quantise as separate linears; paramscope's memory does not model that "
                                   "layout; choose a storage with {0}", "dtype")
        out = set()
        for module in linear_modules:
            weight = f"{module}.weight" if module else "weight"
            if weight in names and self._scheme_of(module) is not None:
                out.add(weight)
        return frozenset(out)

    def named_bytes(self, name: str, shape: tuple[int, ...]) -> TensorBytes:
        scheme = self._scheme_of(name.rpartition(".")[0])
        if scheme is None:  # weights.py asks only of the names `select` gave
            raise UnsupportedError(f"{name} is in no compressed-tensors config group")
        return scheme_bytes(scheme, shape)

    def tensor_bytes(self, shape: tuple[int, ...]) -> TensorBytes:
        schemes = list(self._schemes.values())
        return scheme_bytes(schemes[0], shape)


def compressed_tensors_format(quant: dict[str, Any], compute: str) -> CompressedTensorsFormat:
    """The format a compressed-tensors quantization_config declares; refused in one line where a group's scheme is
    none paramscope models, or where no group is given."""
    groups = quant.get("config_groups")
    if not isinstance(groups, dict) or not any(isinstance(g, dict) for g in groups.values()):
        raise UnsupportedError("the config's compressed-tensors quantization_config has no config_groups; choose a "
                               "storage with {0}", "dtype")
    def words(name: str, g: dict[str, Any]) -> str:
        w = g.get("weights") if isinstance(g.get("weights"), dict) else {}
        how = w.get("group_size") if w.get("strategy") in ("group", "tensor_group") else w.get("block_structure")
        return (f"{name}: {w.get('type', '?')}{w.get('num_bits', '?')} {w.get('strategy', '?')}"
                f"{f' {how}' if how else ''} ({g.get('format') or quant.get('format')})")

    described = "; ".join(words(k, g) for k, g in groups.items() if isinstance(g, dict))
    return CompressedTensorsFormat("compressed-tensors", "compressed-tensors",
                                   f"compressed-tensors as stored ({described}), the rest {short_name(compute)}",
                                   compute, "linear", config=quant)
