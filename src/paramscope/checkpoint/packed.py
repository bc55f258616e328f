"""Packed quantised checkpoints reconciled per role: logical parameters (unpacked), stored bytes, and the scale,
zero-point and index bytes each quantised weight brings; and the config's `quantization_config` checked against
what the headers hold.

Layouts, as the libraries write them (each read from its source):

* compressed-tensors pack-quantized (compressors/pack_quantized): `X.weight_packed` I32 [out, ⌈in·b/32⌉] (b = 1..8
  bits, packed densely along each row), `X.weight_scale` [out, ⌈in/g⌉] (group) or [out, 1] (channel),
  `X.weight_zero_point` I32 [⌈out·b/32⌉, groups] when asymmetric, `X.weight_shape` I64 [2] (the unpacked shape,
  in tensor data), `X.weight_g_idx` I32 [in] under activation order;
* compressed-tensors int-quantized / float-quantized: `X.weight` I8 or F8 at the model's shape, `X.weight_scale`
  [1] (tensor), [out, 1] (channel), [out, ⌈in/g⌉] (group) or [⌈out/bo⌉, ⌈in/bi⌉] (block, e.g. 128×128); fp8
  checkpoints of `quant_method: fp8` name it `weight_scale_inv`;
* compressed-tensors nvfp4-pack-quantized (compressors/nvfp4): `X.weight_packed` U8 [out, in/2], `X.weight_scale`
  F8_E4M3 [out, in/16], `X.weight_global_scale` F32 [1], `X.input_global_scale` F32 [1]; mxfp4-pack-quantized the
  same with U8 (e8m0) scales per 32 and no global scale;
* MXFP4 (gpt-oss, transformers' integrations/mxfp4.py): `X_blocks` U8 [..., n/32, 16] and `X_scales` U8
  [..., n/32] for the experts' gate_up_proj and down_proj;
* bitsandbytes LLM.int8 (bitsandbytes' Int8Params, transformers' quantizer_bnb_8bit): `X.weight` I8 [out, in],
  `X.SCB` F32 [out], `X.weight_format` U8 [];
* GPTQ/AWQ (`qweight`, `qzeros`, `scales`, `g_idx`) and bitsandbytes 4-bit, as quantisation.py marks them.

A checkpoint whose headers contradict themselves (a packed shape that cannot hold its `weight_shape`, scales that
fit no group of the weight, blocks and scales of different shapes) raises CheckpointError: no library loads it. A
config that says one thing and headers that hold another is a finding (`QuantMismatch`), named in the report.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, Iterable, Mapping

from ..errors import CheckpointError
from ..errors import short_repr as _q
from ..frozen import FrozenDict, freeze_fields
from .tensors import Checkpoint, CheckpointTensor, make_tensor

SCALE, ZERO, INDEX = "scale", "zero", "index"
# Bookkeeping by the last component of its name: what overhead it is.
_AUX_KIND = {
    "weight_scale": SCALE, "weight_scale_inv": SCALE, "weight_scale_2": SCALE, "weight_global_scale": SCALE,
    "input_scale": SCALE, "input_global_scale": SCALE, "output_scale": SCALE, "k_scale": SCALE, "v_scale": SCALE,
    "SCB": SCALE, "scales": SCALE, "absmax": SCALE, "nested_absmax": SCALE, "quant_map": SCALE,
    "nested_quant_map": SCALE,
    "weight_zero_point": ZERO, "qzeros": ZERO,
    "g_idx": INDEX, "weight_g_idx": INDEX, "weight_shape": INDEX, "weight_format": INDEX,
    "quant_state": INDEX,  # bitsandbytes 4-bit's serialised state (`X.weight.quant_state.bitsandbytes__nf4`)
}
_WEIGHT_NAMES = ("weight_packed", "qweight", "weight")  # what a module's bookkeeping belongs to, tried in order
_BNB4_STATE = re.compile(r"^(?P<weight>.+\.weight)\.(absmax|quant_map|nested_absmax|nested_quant_map|quant_state\..+)$")
# At most this many weight_shape records are read (each 16 bytes of tensor data); a real checkpoint holds one per
# quantised linear layer, a 256-expert MoE about 50,000.
MAX_SHAPE_RECORDS = 200_000
_NO_AUX: Mapping[str, CheckpointTensor] = {}
_FP8 = ("F8_E4M3", "F8_E5M2", "F8_E4M3FNUZ", "F8_E5M2FNUZ")


@dataclass(frozen=True)
class PackedRole:
    """One role's quantised storage: its weights' logical parameters and bytes, and their bookkeeping."""

    role: str
    tensors: int  # weight tensors stored (packed or not)
    parameters: int  # logical parameters, unpacked
    stored_bytes: int  # bytes of the weight values as stored
    scale_bytes: int  # weight and activation scales (SCB, absmax, global scales included)
    zero_bytes: int  # zero points
    index_bytes: int  # group indices, weight_shape records, weight_format, bnb quant_state
    schemes: tuple[str, ...]  # how this role's weights are stored, e.g. "int4 group 128 (compressed-tensors)"

    @property
    def overhead_bytes(self) -> int:
        return self.scale_bytes + self.zero_bytes + self.index_bytes

    @property
    def bits_per_parameter(self) -> float | None:
        total = self.stored_bytes + self.overhead_bytes
        return None if not self.parameters else total * 8 / self.parameters

    def to_dict(self) -> dict[str, Any]:
        return {"role": self.role, "tensors": self.tensors, "parameters": self.parameters,
                "stored_bytes": self.stored_bytes, "scale_bytes": self.scale_bytes, "zero_bytes": self.zero_bytes,
                "index_bytes": self.index_bytes, "overhead_bytes": self.overhead_bytes,
                "bits_per_parameter": self.bits_per_parameter, "schemes": list(self.schemes)}


@dataclass(frozen=True)
class QuantMismatch:
    """The config's quantization_config and the headers disagree on one field for these weights."""

    field: str  # method | format | bits | type | strategy | group_size | block | quantised | unquantised
    config: str  # what the config says, with the key it is read from
    headers: str  # what the headers hold
    tensors: tuple[str, ...]  # the checkpoint weights concerned (all of them)

    @property
    def line(self) -> str:
        n = len(self.tensors)
        names = ", ".join(self.tensors[:3]) + (f" … and {n - 3} more" if n > 3 else "")
        return (f"{self.field}: quantization_config says {self.config}; the headers hold {self.headers} "
                f"({n} weight{'s' if n != 1 else ''}: {names})")

    def to_dict(self) -> dict[str, Any]:
        return {"field": self.field, "config": self.config, "headers": self.headers, "tensors": list(self.tensors)}


@dataclass(frozen=True)
class PackedAudit:
    """A quantised checkpoint per role, and how its quantization_config agrees with its headers."""

    roles: tuple[PackedRole, ...]
    declared: str | None  # the quantization_config in words, None when the config has none
    mismatches: tuple[QuantMismatch, ...]
    shape_records: int  # weight_shape records read from tensor data (16 bytes each)
    schemes: FrozenDict[str, int] = field(default_factory=FrozenDict)  # scheme → weights stored so

    def __post_init__(self) -> None:
        freeze_fields(self, "schemes")

    @property
    def parameters(self) -> int:
        return sum(r.parameters for r in self.roles)

    @property
    def stored_bytes(self) -> int:
        return sum(r.stored_bytes for r in self.roles)

    @property
    def overhead_bytes(self) -> int:
        return sum(r.overhead_bytes for r in self.roles)

    def to_dict(self) -> dict[str, Any]:
        return {"declared": self.declared, "schemes": dict(self.schemes), "parameters": self.parameters,
                "stored_bytes": self.stored_bytes, "overhead_bytes": self.overhead_bytes,
                "shape_records_read": self.shape_records, "roles": [r.to_dict() for r in self.roles],
                "mismatches": [m.to_dict() for m in self.mismatches]}


# ---------------------------------------------------------------------------------------------
# weight_shape records: the one thing read from tensor data
# ---------------------------------------------------------------------------------------------


def read_shape_records(checkpoint: Checkpoint) -> dict[str, tuple[int, ...]]:
    """The values of every compressed-tensors `X.weight_shape` record of a local safetensors checkpoint: at most
    4 integers each (the header says so before a byte is read), through the safetensors library, which reads
    that tensor's bytes and nothing else. Hub checkpoints (headers only) and .bin files give none."""
    records = [t for t in checkpoint.tensors if t.name.endswith("weight_shape") and t.role == "quant_aux"]
    if not records or not checkpoint.format.startswith("safetensors") or checkpoint.path.startswith("hub:"):
        return {}
    if len(records) > MAX_SHAPE_RECORDS:
        raise CheckpointError(f"{checkpoint.path}: {len(records):,} weight_shape records, more than the "
                              f"{MAX_SHAPE_RECORDS:,} paramscope reads")
    for t in records:
        if t.dtype not in ("I64", "I32") or len(t.shape) != 1 or not 1 <= t.shape[0] <= 4:
            raise CheckpointError(f"{t.file}: tensor {_q(t.name)}: a weight_shape record must be 1 to 4 integers "
                                  f"(I64 or I32), got {t.dtype} {list(t.shape)}")
    from safetensors import safe_open

    out: dict[str, tuple[int, ...]] = {}
    by_file: dict[str, list[CheckpointTensor]] = defaultdict(list)
    for t in records:
        by_file[t.file].append(t)
    for file, tensors in by_file.items():
        try:
            with safe_open(file, framework="numpy") as handle:
                for t in tensors:
                    values = tuple(int(v) for v in handle.get_tensor(t.name).tolist())
                    if any(v < 0 for v in values):
                        raise CheckpointError(f"{file}: tensor {_q(t.name)}: weight_shape {list(values)} holds a "
                                              "negative dimension")
                    out[t.name] = values
        except CheckpointError:
            raise
        except Exception as err:  # the Rust extension raises its own types
            raise CheckpointError(f"{file}: the weight_shape records cannot be read: {err}") from None
    return out


def with_shape_records(checkpoint: Checkpoint, records: Mapping[str, tuple[int, ...]]) -> Checkpoint:
    """`checkpoint` with each int32 `X.weight_packed` given the logical count its `X.weight_shape` records, after
    checking that the packed shape holds that shape at some width of 1 to 8 bits (else CheckpointError)."""
    if not records:
        return checkpoint
    tensors = list(checkpoint.tensors)
    for i, t in enumerate(tensors):
        if t.role != "packed" or not t.name.endswith(".weight_packed") or t.dtype != "I32":
            continue
        shape = records.get(t.name[: -len("weight_packed")] + "weight_shape")
        if shape is None:
            continue
        if not _packed_bits(t.shape, shape):
            raise CheckpointError(
                f"{t.file}: tensor {_q(t.name)}: packed shape {list(t.shape)} cannot hold weight_shape {list(shape)} "
                f"at any width of 1 to 8 bits (⌈in·bits/32⌉ int32 words a row, as compressed-tensors packs)")
        tensors[i] = make_tensor(t.name, t.dtype, t.shape, t.numel, t.nbytes, t.file, t.role, math.prod(shape),
                                 t.packing, "compressed-tensors int32-packed weight; unpacked shape from weight_shape")
    return Checkpoint(checkpoint.path, checkpoint.format, tuple(tensors), checkpoint.metadata)


def _packed_bits(packed: tuple[int, ...], logical: tuple[int, ...]) -> tuple[int, ...]:
    """The widths (1..8 bits) at which compressed-tensors packs `logical` into int32 words of shape `packed`."""
    if not logical or len(packed) != len(logical) or packed[:-1] != logical[:-1]:
        return ()
    return tuple(b for b in range(1, 9) if -(-logical[-1] * b // 32) == packed[-1])


# ---------------------------------------------------------------------------------------------
# each weight's layout, from its headers
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Layout:
    method: str  # compressed-tensors | gptq | awq | fp8 | mxfp4 | bitsandbytes | "" (unquantised)
    format: str  # compressed-tensors' format name, or the method's
    type: str  # int | float | "" (unquantised)
    bits: int | None
    strategy: str  # tensor | channel | group | block | tensor_group | ""
    group: int | None  # values a scale covers along a row (group strategies)
    block: tuple[int, int] | None  # (rows, columns) a scale covers (block strategy), when the headers tell
    scale_shape: tuple[int, ...] = ()  # the block strategy's scale shape, for a message
    columns: int = 0  # values in a row (the unpacked last dimension), for group strategies
    groups: int = 0  # scales in a row, for group strategies

    @cached_property  # a frozen dataclass without slots: cached in its __dict__
    def scheme(self) -> str:
        if not self.method:
            return f"{self.format} (unquantised)"
        width = f"{self.type}{self.bits}" if self.bits else self.type or "?"
        how = {"group": f" group {self.group}" if self.group else " group", "tensor_group": f" group {self.group}",
               "block": f" block {self.block[0]}×{self.block[1]}" if self.block else " block",
               "channel": " per channel", "tensor": " per tensor"}.get(self.strategy, "")
        return f"{width}{how} ({self.format})"


def _unquantised(dtype: str) -> _Layout:
    return _Layout("", dtype, "", None, "", None, None)


def _layout(weight: CheckpointTensor, aux: Mapping[str, CheckpointTensor], logical_shape: tuple[int, ...] | None,
            declared_block: tuple[int, int] | None, declared_group: int | None = None) -> _Layout:
    """How `weight` is stored, from its header, its bookkeeping (`aux`: last name component → tensor) and the
    unpacked shape (a weight_shape record, else the model's). Raises CheckpointError where they contradict.

    A group size is named as the config declares it when the scales fit it (⌈columns / size⌉ scales a row: 144
    values in groups of 128 keep 2); else as the headers alone tell it, the smallest size that fits."""
    name, shape, dtype = weight.name, weight.shape, weight.dtype
    last = name.rpartition(".")[2]

    def bad(what: str) -> CheckpointError:
        return CheckpointError(f"{weight.file}: tensor {_q(name)} {dtype} {list(shape)}: {what}")

    def per_row(scale: CheckpointTensor, rows: int, cols: int, fmt: str, kind: str, bits: int) -> _Layout:
        # a [rows, groups] scale (or one scalar) over a [rows, cols] weight: tensor, channel or group strategy
        if scale.numel == 1:
            return _Layout("compressed-tensors", fmt, kind, bits, "tensor", None, None)
        if len(scale.shape) != 2 or scale.shape[0] != rows or not 1 <= scale.shape[1] <= max(cols, 1):
            raise bad(f"scale {_q(scale.name)} {list(scale.shape)} fits no tensor, channel or group layout of "
                      f"[{rows}, {cols}]")
        groups = scale.shape[1]
        return _grouped("compressed-tensors", fmt, kind, bits, cols, groups, scale)

    def _grouped(method: str, fmt: str, kind: str, bits: int, cols: int, groups: int,
                 scale: CheckpointTensor) -> _Layout:
        if declared_group and declared_group > 0 and -(-cols // declared_group) == groups:
            return _Layout(method, fmt, kind, bits, "group", declared_group, None, (), cols, groups)
        if groups == 1:
            return _Layout(method, fmt, kind, bits, "channel", None, None, (), cols, groups)
        size = -(-cols // groups)
        if -(-cols // size) != groups and method in ("gptq", "awq"):  # as before: counted, its groups not named
            return _Layout(method, fmt, kind, bits, "group", None, None, (), cols, groups)
        if -(-cols // size) != groups:
            raise bad(f"scale {_q(scale.name)} {list(scale.shape)}: {groups} groups fit no group size of a "
                      f"{cols}-value row")
        return _Layout(method, fmt, kind, bits, "group", size, None, (), cols, groups)

    if weight.packing == "mxfp4":
        scales = aux.get(last[: -len("_blocks")] + "_scales")
        if scales is None or scales.shape != shape[:-1]:
            got = "none" if scales is None else list(scales.shape)
            raise bad(f"MXFP4 scales must be {list(shape[:-1])}, one a 32-value block; got {got}")
        return _Layout("mxfp4", "mxfp4", "float", 4, "group", 32, None)
    if weight.packing == "gptq":
        scales, qzeros = aux.get("scales"), aux.get("qzeros")
        if scales is None or qzeros is None or weight.logical_numel is None or len(shape) != 2 or \
                len(scales.shape) != 2 or len(qzeros.shape) != 2 or not scales.shape[1]:
            # a layout quantisation.py does not unpack (the reconciliation names it): counted, not described
            return _Layout("gptq", "gptq (layout not read)", "int", None, "", None, None)
        bits = 32 * qzeros.shape[1] // scales.shape[1] if scales.shape[1] else 0
        out = scales.shape[1]
        cols = weight.logical_numel // out if out else 0
        method = "gptq" if shape[1] == out else "awq"  # GPTQ packs along in ([in·b/32, out]), AWQ along out
        return _grouped(method, method, "int", bits, cols, max(scales.shape[0], 1), scales)
    if weight.packing == "bnb-4bit":
        # the quant type is in the state's name: `X.weight.quant_state.bitsandbytes__nf4` (or __fp4)
        state = aux.get("quant_state")
        kind = state.name.rpartition("__")[2] if state is not None and "__" in state.name else "nf4/fp4"
        return _Layout("bitsandbytes", "bitsandbytes 4-bit", kind, None, "group", None, None)
    if last == "weight_packed" and dtype == "U8":
        scale = aux.get("weight_scale")
        rows, cols = (shape[0], 2 * shape[1]) if len(shape) == 2 else (0, 0)
        if scale is None or len(scale.shape) != 2 or scale.shape[0] != rows or not scale.shape[1] or \
                cols % scale.shape[1]:
            raise bad(f"fp4 weight_scale must be [{rows}, {cols}/group]; got "
                      f"{'none' if scale is None else list(scale.shape)}")
        group = cols // scale.shape[1]
        nv = scale.dtype in _FP8
        fmt, want = ("nvfp4-pack-quantized", 16) if nv else ("mxfp4-pack-quantized", 32)
        if group != want:
            raise bad(f"{fmt} keeps one {scale.dtype} scale per {want} values; weight_scale {list(scale.shape)} "
                      f"gives one per {group}")
        return _Layout("compressed-tensors", fmt, "float", 4, "tensor_group" if nv else "group", group, None)
    if last == "weight_packed":
        logical = logical_shape or ()
        widths = _packed_bits(shape, logical)
        if not widths:
            raise bad(f"packed shape cannot hold the unpacked {list(logical)} at any width of 1 to 8 bits")
        bits = max(b for b in widths if b in (2, 3, 4, 8)) if any(b in (2, 3, 4, 8) for b in widths) else widths[-1]
        scale = aux.get("weight_scale")
        if scale is None:
            raise bad("packed weight without weight_scale")
        return per_row(scale, logical[0], logical[-1], "pack-quantized", "int", bits)
    if dtype == "I8" and "SCB" in aux:
        scb = aux["SCB"]
        if len(shape) != 2 or scb.shape != shape[:1]:
            raise bad(f"LLM.int8 keeps one SCB scale a row: [{shape[0] if shape else 0}], got {list(scb.shape)}")
        return _Layout("bitsandbytes", "bitsandbytes 8-bit", "int", 8, "channel", None, None)
    scale = aux.get("weight_scale", aux.get("weight_scale_inv"))
    if scale is not None and dtype in (*_FP8, "I8") and len(shape) == 2:
        kind, fmt = ("int", "int-quantized") if dtype == "I8" else ("float", "float-quantized")
        method = "fp8" if "weight_scale_inv" in aux else "compressed-tensors"  # transformers' FineGrainedFP8 names
        fmt = "fp8" if method == "fp8" else fmt
        rows, cols = shape
        fits_declared = declared_block is not None and len(scale.shape) == 2 and scale.shape == (
            -(-rows // declared_block[0]), -(-cols // declared_block[1]))
        if fits_declared:  # one block of a small weight is also one scale for the tensor: the config tells which
            return _Layout(method, fmt, kind, 8, "block", None, declared_block, scale.shape)
        if len(scale.shape) == 2 and scale.numel > 1 and not (scale.shape[0] == rows and rows > 1):
            a, b = scale.shape
            if not (1 <= a <= rows and 1 <= b <= cols):
                raise bad(f"scale {_q(scale.name)} {list(scale.shape)} fits no block layout of [{rows}, {cols}]")
            # the smallest block that gives these scales, when each dimension divides (⌈rows/a⌉ otherwise is one
            # of several that do)
            block = (rows // a, cols // b) if rows % a == 0 and cols % b == 0 else None
            return _Layout(method, fmt, kind, 8, "block", None, block, scale.shape)
        return replace(per_row(scale, rows, cols, fmt, kind, 8), method=method)
    return _unquantised(dtype)


# ---------------------------------------------------------------------------------------------
# the audit
# ---------------------------------------------------------------------------------------------


def is_quantised(checkpoint: Checkpoint, quantization_config: Any) -> bool:
    """Whether `analyse` has anything to say: the config declares quantisation or a header holds packed weights or
    quantisation bookkeeping."""
    return isinstance(quantization_config, dict) or any(t.role != "tensor" for t in checkpoint.tensors)


def analyse(checkpoint: Checkpoint, *, parameter_of: Mapping[str, str], roles: Mapping[str, str],
            shapes: Mapping[str, tuple[int, ...]], quantization_config: Any = None,
            shape_records: Mapping[str, tuple[int, ...]] = {}) -> PackedAudit:  # noqa: B006 - read-only
    """Per role: logical parameters, stored bytes and bookkeeping bytes; and the config checked against headers.

    `parameter_of` maps a checkpoint key to the model parameter it loads into (the reconciliation's; a tied alias
    mapped to its canonical name, so that it counts once), `roles` and
    `shapes` give each model parameter's role and shape. Weights that load into no parameter are left out of the
    roles (the reconciliation lists them); bookkeeping of no weight (kv-cache scales) goes to the role
    "quantisation state".
    """
    config = quantization_config if isinstance(quantization_config, dict) else None
    expected = DeclaredQuantization(config)
    names = {t.name: t for t in checkpoint.tensors}
    owned: dict[str, dict[str, CheckpointTensor]] = defaultdict(dict)  # weight key → last component → aux tensor
    loose: list[CheckpointTensor] = []
    for t in checkpoint.tensors:
        if t.role == "quant_aux":
            owner = _owner(t.name, names)
            if owner is None:
                loose.append(t)
            else:
                owned[owner][_aux_key(t.name)] = t

    rows: dict[str, dict[str, Any]] = {}
    schemes: dict[str, int] = defaultdict(int)
    disagreements: dict[tuple[str, str, str], list[str]] = defaultdict(list)
    counted: set[str] = set()

    def row(role: str) -> dict[str, Any]:
        return rows.setdefault(role, {"tensors": 0, "parameters": 0, "stored": 0, SCALE: 0, ZERO: 0, INDEX: 0,
                                      "schemes": {}})

    # A checkpoint may hold a million tensors and most weights share a layout: each distinct (header, bookkeeping,
    # unpacked shape, role, config verdict) is worked out once.
    memo: dict[tuple, tuple[_Layout, str, tuple[tuple[str, str, str], ...]]] = {}
    for t in checkpoint.tensors:
        if t.role == "quant_aux":
            continue
        parameter = parameter_of.get(t.name)
        if parameter is None:
            continue
        aux = owned.get(t.name, _NO_AUX)
        module = _module_of(t.name)
        role = roles.get(parameter, "other")
        shape = shape_records.get(f"{module}.weight_shape") if shape_records else None
        group = expected.group(module)
        key = (t.dtype, t.shape, t.packing, t.name.rpartition(".")[2], t.logical_numel, shape or shapes.get(parameter),
               role, expected.listed(module), group[0] if group else None,
               tuple((k, a.dtype, a.shape) for k, a in aux.items()) if aux else ())
        known = memo.get(key)
        if known is None:
            layout = _layout(t, aux, key[5], expected.block_for(group), expected.group_size(group))
            checks = tuple(expected.check(key[7], group, t, layout, role))
            if config is None and layout.method:
                checks += (("method", "nothing (the config has no quantization_config)", layout.scheme),)
            known = memo[key] = (layout, layout.scheme, checks)
        layout, scheme, checks = known
        r = rows.get(role) or row(role)
        r["tensors"] += 1
        if parameter not in counted:  # a tied parameter stored twice counts once
            counted.add(parameter)
            r["parameters"] += math.prod(shapes[parameter])
        r["stored"] += t.nbytes
        for k, a in aux.items():
            r[_AUX_KIND.get(k, SCALE)] += a.nbytes
        r["schemes"][scheme] = None
        schemes[scheme] += 1
        for check in checks:
            disagreements[check].append(t.name)
    for t in loose:
        r = row("quantisation state")
        r[_AUX_KIND.get(_aux_key(t.name), SCALE)] += t.nbytes
    order = sorted(rows, key=lambda role: (role == "quantisation state", -rows[role]["parameters"], role))
    return PackedAudit(
        roles=tuple(PackedRole(role, rows[role]["tensors"], rows[role]["parameters"], rows[role]["stored"],
                               rows[role][SCALE], rows[role][ZERO], rows[role][INDEX], tuple(rows[role]["schemes"]))
                    for role in order),
        declared=expected.describe(),
        mismatches=tuple(QuantMismatch(f, said, held, tuple(sorted(ts)))
                         for (f, said, held), ts in sorted(disagreements.items())),
        shape_records=len(shape_records),
        schemes=dict(sorted(schemes.items(), key=lambda kv: (-kv[1], kv[0]))),
    )


def _aux_key(name: str) -> str:
    m = _BNB4_STATE.match(name) if ".weight." in name else None
    if m:
        state = name[len(m["weight"]) + 1:]
        return "quant_state" if state.startswith("quant_state.") else state
    return name.rpartition(".")[2]


def _owner(name: str, names: Mapping[str, CheckpointTensor]) -> str | None:
    """The weight key whose bookkeeping `name` is, or None (kv-cache scales, an orphan scale)."""
    m = _BNB4_STATE.match(name) if ".weight." in name else None
    if m:
        return m["weight"] if m["weight"] in names else None
    stem, _, last = name.rpartition(".")
    if last.endswith("_scales") and last != "scales":
        blocks = name[: -len("_scales")] + "_blocks"
        return blocks if blocks in names else None
    prefix = f"{stem}." if stem else ""
    for weight in _WEIGHT_NAMES:
        if prefix + weight in names and names[prefix + weight].role != "quant_aux":
            return prefix + weight
    return None


def _module_of(key: str) -> str:
    """The module a weight key belongs to, as quantisation configs name modules (`model.layers.0.mlp.down_proj`;
    gpt-oss's experts' `..._blocks` belong to `model.layers.0.mlp.experts`)."""
    return key.rpartition(".")[0]


# ---------------------------------------------------------------------------------------------
# what the quantization_config declares
# ---------------------------------------------------------------------------------------------


def _matcher(patterns: Iterable[Any], how: str) -> Any:
    """One compiled pattern that fullmatches a module name when any of `patterns` names it, as the library reads
    its list: compressed-tensors' "re:" regexes (re.match) or exact names; transformers' modules_to_not_convert and
    llm_int8_skip_modules (quantizers_utils.should_convert_module: a regex from the start up to a name boundary, or
    a literal suffix). None when no pattern is usable; a regex that does not compile is read as a literal only."""
    parts: list[str] = []
    for p in patterns:
        if not isinstance(p, str) or not p:
            continue
        try:
            re.compile(p[3:] if how == "compressed-tensors" and p.startswith("re:") else p)
            valid = True
        except re.error:
            valid = False
        if how == "compressed-tensors":
            if p.startswith("re:"):
                if valid:
                    parts.append(f"(?:{p[3:]}).*")
            else:
                parts.append(re.escape(p))
        else:
            if valid:
                parts.append(rf"(?:{p})(?:(?<=\.)|(?=\.|$)).*")
            parts.append(f".*{re.escape(p)}")
    return re.compile("|".join(f"(?:{part})" for part in parts), re.DOTALL) if parts else None


class DeclaredQuantization:
    """What the quantization_config says of each module."""

    def __init__(self, config: dict[str, Any] | None) -> None:
        self.config = config or {}
        self.method = str(self.config.get("quant_method") or "").lower() if config else ""
        if self.method == "bitsandbytes" or (config and not self.method and (
                self.config.get("load_in_8bit") or self.config.get("load_in_4bit"))):
            self.method = "bitsandbytes_8bit" if self.config.get("load_in_8bit") else "bitsandbytes_4bit"
        self.groups: list[tuple[str, dict[str, Any]]] = []
        if self.method == "compressed-tensors":
            groups = self.config.get("config_groups")
            if isinstance(groups, dict):
                self.groups = [(str(k), v) for k, v in groups.items() if isinstance(v, dict)]

        def targets(g: dict[str, Any]) -> list[str]:
            found = g.get("targets")
            return [t for t in found if isinstance(t, str)] if isinstance(found, list) else []

        # targets that name modules ("re:" regexes, dotted names), per group; the first group that targets a class
        # (Linear) covers every other linear layer
        self._named_targets = [(n, g, named) for n, g in self.groups
                               if (named := [t for t in targets(g) if t.startswith("re:") or "." in t])]
        self._class_group = next(((n, g) for n, g in self.groups
                                  if any(not t.startswith("re:") and "." not in t for t in targets(g))), None)
        skip_key, self._how = {"compressed-tensors": ("ignore", "compressed-tensors"),
                               "fp8": ("modules_to_not_convert", "transformers"),
                               "mxfp4": ("modules_to_not_convert", "transformers"),
                               "bitsandbytes_8bit": ("llm_int8_skip_modules", "transformers"),
                               "bitsandbytes_4bit": ("llm_int8_skip_modules", "transformers")}.get(
            self.method, ("", ""))
        skip = self.config.get(skip_key) if skip_key else None
        self._skip = _matcher(skip if isinstance(skip, list) else [], self._how)
        self._named_matchers = [(n, g, _matcher(named, "compressed-tensors")) for n, g, named in self._named_targets]

    def describe(self) -> str | None:
        if not self.config:
            return None
        if self.method == "compressed-tensors":
            parts = []
            for name, g in self.groups:
                w = g.get("weights") if isinstance(g.get("weights"), dict) else {}
                parts.append(f"{name}: {w.get('type', '?')}{w.get('num_bits', '?')} {w.get('strategy', '?')}"
                             + (f" {w['group_size']}" if w.get("group_size") else "")
                             + (f" {w['block_structure']}" if w.get("block_structure") else ""))
            ignore = self.config.get("ignore") or []
            return (f"compressed-tensors, format {self.config.get('format', '?')}; " + "; ".join(parts)
                    + (f"; ignore {', '.join(map(str, ignore))}" if ignore else ""))
        if self.method in ("gptq", "awq"):
            return f"{self.method} {self.config.get('bits', '?')}-bit, group size {self.config.get('group_size', '?')}"
        if self.method == "fp8":
            block = self.config.get("weight_block_size")
            return "fp8" + (f", blocks {block}" if block else "")
        if self.method == "mxfp4":
            skip = self.config.get("modules_to_not_convert") or []
            return "mxfp4" + (f", not converted: {', '.join(map(str, skip))}" if skip else "")
        if self.method.startswith("bitsandbytes"):
            skip = self.config.get("llm_int8_skip_modules") or []
            return (f"bitsandbytes {'8' if self.method.endswith('8bit') else '4'}-bit"
                    + (f", skipped: {', '.join(map(str, skip))}" if skip else ""))
        return self.method or "a quantization_config without quant_method"

    def group(self, module: str) -> tuple[str, dict[str, Any]] | None:
        """compressed-tensors: the config group whose targets name `module` (a "re:" regex or the exact name),
        else the first whose targets are class names (Linear), which cover every linear layer."""
        if not self.groups:
            return None
        for name, g, matcher in self._named_matchers:
            if matcher is not None and matcher.fullmatch(module):
                return name, g
        return self._class_group

    def listed(self, module: str) -> bool:
        """Whether the config's list of modules kept unquantised names `module` (compressed-tensors' ignore,
        modules_to_not_convert, llm_int8_skip_modules)."""
        return self._skip is not None and self._skip.fullmatch(module) is not None

    def group_size(self, group: tuple[str, dict[str, Any]] | None) -> int | None:
        size: Any = None
        if self.method in ("gptq", "awq"):
            size = self.config.get("group_size", self.config.get("q_group_size"))
        elif group is not None:
            w = group[1].get("weights")
            size = w.get("group_size") if isinstance(w, dict) else None
        return size if type(size) is int and size > 0 else None

    def block_for(self, group: tuple[str, dict[str, Any]] | None) -> tuple[int, int] | None:
        block = None
        if self.method == "fp8":
            block = self.config.get("weight_block_size")
        elif group is not None:
            w = group[1].get("weights")
            block = w.get("block_structure") if isinstance(w, dict) else None
        if isinstance(block, list) and len(block) == 2 and all(type(v) is int and v > 0 for v in block):
            return block[0], block[1]
        return None

    def check(self, listed: bool, group: tuple[str, dict[str, Any]] | None, weight: CheckpointTensor,
              layout: _Layout, role: str) -> list[tuple[str, str, str]]:
        """(field, what the config says, what the headers hold) for each disagreement about this weight, whose
        module the config's unquantised list names (`listed`) or not, in config `group` (compressed-tensors)."""
        if not self.config:
            return []
        out: list[tuple[str, str, str]] = []
        quantised = bool(layout.method)
        linear = len(weight.shape) == 2 and weight.name.endswith(".weight") and not role.startswith("embeddings") \
            and "norm" not in role
        held = layout.scheme
        if self.method == "compressed-tensors":
            if listed and quantised:
                out.append(("unquantised", "ignore names its module", held))
            if not quantised:
                if not listed and group is not None and linear:
                    out.append(("quantised", f"{group[0]} targets it ({', '.join(map(str, group[1].get('targets')))})"
                                f" and ignore does not name it", held))
                return out
            if group is None:
                return out
            gname, g = group
            w = g.get("weights") if isinstance(g.get("weights"), dict) else {}
            fmt = g.get("format") or self.config.get("format")
            if isinstance(fmt, str) and fmt not in ("mixed-precision",) and fmt != layout.format:
                out.append(("format", f"format {fmt}", layout.format))
            if w.get("num_bits") is not None and w.get("num_bits") != layout.bits:
                out.append(("bits", f"{w.get('type', '')}{w['num_bits']} ({gname}.weights.num_bits)",
                            f"{layout.type}{layout.bits}"))
            elif w.get("type") and w["type"] != layout.type:
                out.append(("type", f"{w['type']} ({gname}.weights.type)", layout.type))
            strategy = w.get("strategy")
            size, block = self.group_size(group), self.block_for(group)
            if strategy in ("group", "tensor_group") and size and layout.groups and \
                    -(-layout.columns // size) != layout.groups:
                out.append(("group_size", f"{size} ({gname}.weights.group_size)", _groups_held(layout)))
            elif isinstance(strategy, str) and strategy != layout.strategy:
                out.append(("strategy", f"{strategy} ({gname}.weights.strategy)", f"{layout.strategy}: {held}"))
            elif strategy == "block" and block and layout.block != block:
                out.append(("block", f"{list(block)} ({gname}.weights.block_structure)", _blocks_held(layout)))
            return out
        if self.method in ("gptq", "awq"):
            if quantised and layout.method in ("gptq", "awq"):
                bits = self.config.get("bits", self.config.get("w_bit"))
                if isinstance(bits, int) and bits != layout.bits:
                    out.append(("bits", f"int{bits} (bits)", f"int{layout.bits}"))
                size = self.group_size(None)
                if size and layout.groups and -(-layout.columns // size) != layout.groups:
                    out.append(("group_size", f"{size} (group_size)", _groups_held(layout)))
            elif quantised:
                out.append(("method", f"{self.method}", held))
            return out
        if self.method == "fp8":
            block = self.block_for(None)
            if quantised and layout.method not in ("fp8", "compressed-tensors"):
                out.append(("method", "fp8", held))
            elif quantised and listed:
                out.append(("unquantised", "modules_to_not_convert names its module", held))
            elif quantised and block and layout.block != block:
                out.append(("block", f"{list(block)} (weight_block_size)", _blocks_held(layout)))
            elif not quantised and linear and role != "head.lm" and not listed:
                out.append(("quantised", "fp8 for every linear layer not in modules_to_not_convert", held))
            return out
        if self.method == "mxfp4":
            if quantised and layout.method != "mxfp4":
                out.append(("method", "mxfp4", held))
            elif quantised and listed:
                out.append(("unquantised", "modules_to_not_convert names its module", held))
            elif not quantised and role == "moe.experts" and len(weight.shape) == 3:
                out.append(("quantised", "mxfp4 for the experts' gate_up_proj and down_proj", held))
            return out
        if self.method.startswith("bitsandbytes"):
            want = "bitsandbytes 8-bit" if self.method.endswith("8bit") else "bitsandbytes 4-bit"
            flag = "load_in_8bit" if self.method.endswith("8bit") else "load_in_4bit"
            if quantised and layout.format != want:
                out.append(("method", f"{want} ({flag})", held))
            elif quantised and listed:
                out.append(("unquantised", "llm_int8_skip_modules names its module", held))
            elif not quantised and linear and role != "head.lm" and not listed:
                # transformers keeps the output head in full precision whatever the list says
                out.append(("quantised", f"{want} ({flag}) for every linear layer but the head", held))
            return out
        if quantised:
            out.append(("method", self.method or "no quant_method", held))
        return out


def _groups_held(layout: _Layout) -> str:
    return (f"{layout.groups} scale{'s' if layout.groups != 1 else ''} a row of {layout.columns} values "
            f"({layout.scheme})")


def _blocks_held(layout: _Layout) -> str:
    if layout.strategy != "block":
        return layout.scheme
    if layout.block:
        return f"scales for blocks of {layout.block[0]}×{layout.block[1]}"
    return f"scales {list(layout.scale_shape)}, which fit no such block"
