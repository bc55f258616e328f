"""Weight storage formats and their exact bytes: plain dtypes, and quantised formats with their metadata.

Each format answers, for one tensor shape, the bytes of its data and of its overhead (scales, zero points,
absmax, per-group metadata), with the arithmetic. Which tensors a format quantises is decided elsewhere
(memory/weights.py), from the real module structure. The layouts are those of the libraries that hold the weights:

- bitsandbytes 4-bit (`Params4bit`): two weights per byte, one fp32 absmax per block of 64, and the 16-entry
  quantisation map (64 B) per tensor. Double quantisation stores the absmax as uint8 instead, plus one fp32
  absmax per 256 of those blocks, a fp32 offset and the nested 256-entry map (1,024 B): 8/64 + 32/(64·256) =
  0.127 bits of scales per weight instead of 0.5, as the QLoRA paper gives.
- bitsandbytes LLM.int8 (`Int8Params`): one byte per weight and one fp32 scale per output row (SCB).
- GPTQ (`QuantLinear`): qweight int32 [in·b/32, out], qzeros int32 [⌈in/g⌉, out·b/32], scales fp16 [⌈in/g⌉, out],
  g_idx int32 [in]. AWQ (GEMM): qweight int32 [in, out·b/32], qzeros likewise, scales fp16 [⌈in/g⌉, out]. A group
  size that does not divide `in` leaves a partial last group, stored whole (DeepSeek-V2-Lite's 10,944 in groups
  of 128: 86 groups, the last of 64).
- fp8: one byte per weight and a fp32 scale per tensor, or per block (DeepSeek-V3 declares 128×128 blocks,
  stored as `weight_scale_inv`).
- MXFP4: two weights per byte and one 8-bit (E8M0) scale per block of 32.
- GGUF (ggml block types): a fixed number of bytes per block of 32 or 256 weights along a row. A row whose
  length is no multiple of the block falls back as llama.cpp's quantiser does (Q4_K → Q5_0, Q5_K → Q5_1,
  Q6_K → Q8_0, Q2_K/Q3_K → Q4_0), then to F16.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ...errors import OptionError, UnsupportedError, short_repr
from ..dtypes import DTYPE_NAMES, itemsize, short_name

# ggml block types: (weights per block, bytes per block, what a block holds)
GGUF_TYPES: dict[str, tuple[int, int, str]] = {
    "q4_0": (32, 18, "fp16 scale + 32×4-bit"),
    "q4_1": (32, 20, "fp16 scale + fp16 min + 32×4-bit"),
    "q5_0": (32, 22, "fp16 scale + 32 high bits + 32×4-bit"),
    "q5_1": (32, 24, "fp16 scale + fp16 min + 32 high bits + 32×4-bit"),
    "q8_0": (32, 34, "fp16 scale + 32×8-bit"),
    "q2_k": (256, 84, "fp16 d + fp16 dmin + 16 scale bytes + 256×2-bit"),
    "q3_k": (256, 110, "fp16 d + 12 scale bytes + 32 high-bit bytes + 256×2-bit"),
    "q4_k": (256, 144, "fp16 d + fp16 dmin + 12 scale bytes + 256×4-bit"),
    "q5_k": (256, 176, "fp16 d + fp16 dmin + 12 scale bytes + 32 high-bit bytes + 256×4-bit"),
    "q6_k": (256, 210, "fp16 d + 16 scale bytes + 256×6-bit"),
    "iq4_nl": (32, 18, "fp16 scale + 32×4-bit non-linear codes"),
    "iq4_xs": (256, 136, "fp16 d + 6 scale bytes + 256×4-bit non-linear codes"),
    "iq3_s": (256, 110, "fp16 d + 64 grid-index bytes + 8 high bits + 32 sign bytes + 4 scale bytes"),
}
_GGUF_FALLBACK = {"q2_k": "q4_0", "q3_k": "q4_0", "q4_k": "q5_0", "q5_k": "q5_1", "q6_k": "q8_0", "iq4_xs": "iq4_nl",
                  "iq3_s": "iq4_nl"}


@dataclass(frozen=True)
class TensorBytes:
    data: int  # bytes of the stored values
    overhead: int  # bytes of scales, zero points, absmax, maps, indices
    storage: str  # what the tensor is stored as, e.g. "nf4", "bf16", "q5_0 (fallback)"
    arithmetic: str  # e.g. "4,096×4,096 / 2 + 262,144 blocks × 4 + 64"

    @property
    def total(self) -> int:
        return self.data + self.overhead


@dataclass(frozen=True)
class WeightFormat:
    """How weights are stored. `kind` picks the layout; `targets` which tensors it quantises (see memory/weights.py)."""

    key: str  # what the user typed, canonical: "bf16", "nf4-dq", "gptq-int4", "q4_k"
    kind: str  # "plain" | "bnb4" | "int8" | "gptq" | "awq" | "fp8" | "mxfp4" | "gguf"
    label: str  # one line for the report
    compute_dtype: str  # torch dtype of the tensors left unquantised, e.g. "bfloat16"
    targets: str = "none"  # "none" | "linear" (nn.Linear/Conv1D) | "linear+experts" | "matrices" | "experts"
    bits: int | None = None
    group_size: int | None = None  # GPTQ/AWQ group along the input dimension; None: one group per row
    block: tuple[int, int] | None = None  # fp8 block scales (rows, columns)
    double_quant: bool = False
    quant_type: str | None = None  # "nf4" | "fp4" for bitsandbytes 4-bit; the ggml type for GGUF
    mixture: str | None = None  # a llama.cpp mixture ("Q4_K_M"): each tensor's type by llama_cpp_mixture.py
    declared: bool = False  # read from the checkpoint's config rather than chosen by the user

    @property
    def quantized(self) -> bool:
        return self.kind != "plain"

    def tensor_bytes(self, shape: tuple[int, ...]) -> TensorBytes:
        """Bytes of one quantised tensor of `shape` (torch order: the last dimension is the input/row)."""
        numel = math.prod(shape)
        cols = shape[-1] if shape else 1
        rows = numel // cols if cols else 0
        return _LAYOUTS[self.kind](self, shape, numel, rows, cols)

    def plain_bytes(self, numel: int, dtype: str) -> TensorBytes:
        size = itemsize(dtype)
        return TensorBytes(numel * size, 0, short_name(dtype), f"{numel:,} × {size}")


def _plain(fmt: WeightFormat, shape, numel, rows, cols) -> TensorBytes:
    return fmt.plain_bytes(numel, fmt.compute_dtype)


def _bnb4(fmt: WeightFormat, shape, numel, rows, cols) -> TensorBytes:
    data = -(-numel // 2)
    blocks = -(-numel // 64)
    qmap = 16 * 4
    if not fmt.double_quant:
        overhead = blocks * 4 + qmap
        text = f"{numel:,} / 2 + {blocks:,} blocks × 4 + 64"
    else:
        nested = -(-blocks // 256)
        overhead = blocks + nested * 4 + 4 + 256 * 4 + qmap
        text = f"{numel:,} / 2 + {blocks:,} blocks × 1 + {nested:,} nested × 4 + 4 + 1,024 + 64"
    return TensorBytes(data, overhead, fmt.quant_type or "nf4", text)


def _int8(fmt: WeightFormat, shape, numel, rows, cols) -> TensorBytes:
    return TensorBytes(numel, rows * 4, "int8", f"{numel:,} × 1 + {rows:,} rows × 4")


def _groups(fmt: WeightFormat, cols: int) -> int:
    """GPTQ/AWQ groups along an input of `cols`: ⌈cols / group⌉, as their QuantLinear allocates scales and zero
    points (a group that does not divide the input leaves a partial last group, which is stored whole)."""
    if fmt.group_size is None or fmt.group_size <= 0:
        return 1
    return -(-cols // fmt.group_size)


# The widest GPTQ/AWQ group a config or --group-size may give: wider than any linear's input (a larger number is a
# typo, not a group). -1 is one group per row (per channel); 0 and other negatives mean nothing.
MAX_GROUP_SIZE = 1 << 20


def group_size_problem(value: Any) -> str | None:
    """Why `value` is no GPTQ/AWQ group size, in words that follow "<field or option> ", or None if it is one."""
    if type(value) is int and (value == -1 or 1 <= value <= MAX_GROUP_SIZE):
        return None
    return (f"must be a positive group size up to {MAX_GROUP_SIZE:,}, or -1 for one group per row; got "
            f"{short_repr(value)}")


def partial_group_notes(fmt: WeightFormat, tensors: Iterable[tuple[str, tuple[int, ...]]]) -> tuple[str, ...]:
    """One line per input width that `fmt`'s GPTQ/AWQ group size does not divide, naming the roles whose inputs
    have it: transformers builds them (GPTQ's and AWQ's QuantLinear store ⌈in / group⌉ groups of scales and zero
    points, the last one partial), so paramscope counts them so and says so. `tensors`: (role, shape) of the
    quantised tensors, torch order (the input last)."""
    group = fmt.group_size
    if fmt.kind not in ("gptq", "awq") or group is None or group <= 0:
        return ()
    roles: dict[int, list[str]] = {}
    for role, shape in tensors:
        cols = shape[-1] if shape else 1
        if cols % group:
            seen = roles.setdefault(cols, [])
            if role not in seen:
                seen.append(role)
    method = fmt.kind.upper()
    notes = []
    for cols, names in sorted(roles.items()):
        whose = f"{names[0]}'s input" if len(names) == 1 else \
            f"the inputs of {', '.join(names[:-1])} and {names[-1]}"
        groups = -(-cols // group)
        if cols < group:
            notes.append(f"group size {group:,} is wider than {cols:,} ({whose}): one group per row, holding "
                         f"{cols:,}, as {method} stores it")
        else:
            notes.append(f"group size {group:,} does not divide {cols:,} ({whose}): its last group holds "
                         f"{cols % group:,}, as {method} stores it (⌈{cols:,}/{group:,}⌉ = {groups:,} groups of "
                         "scales and zero points)")
    return tuple(notes)


def _gptq(fmt: WeightFormat, shape, numel, rows, cols) -> TensorBytes:
    bits = fmt.bits or 4
    matrices = math.prod(shape[:-2]) if len(shape) > 2 else 1  # fused experts: one g_idx per matrix
    outs = rows  # all output rows, experts included
    groups = _groups(fmt, cols)
    qweight = -(-cols * bits // 32) * outs * 4
    qzeros = groups * -(-outs * bits // 32) * 4
    scales = groups * outs * 2
    g_idx = cols * 4 * matrices
    text = (f"qweight {cols:,}·{bits}/32 × {outs:,} × 4 + qzeros {groups:,} × {outs:,}·{bits}/32 × 4 + "
            f"scales {groups:,} × {outs:,} × 2 + g_idx {cols:,} × 4")
    return TensorBytes(qweight, qzeros + scales + g_idx, f"gptq int{bits}", text)


def _awq(fmt: WeightFormat, shape, numel, rows, cols) -> TensorBytes:
    bits = fmt.bits or 4
    outs = rows
    groups = _groups(fmt, cols)
    qweight = cols * -(-outs * bits // 32) * 4
    qzeros = groups * -(-outs * bits // 32) * 4
    scales = groups * outs * 2
    text = (f"qweight {cols:,} × {outs:,}·{bits}/32 × 4 + qzeros {groups:,} × {outs:,}·{bits}/32 × 4 + "
            f"scales {groups:,} × {outs:,} × 2")
    return TensorBytes(qweight, qzeros + scales, f"awq int{bits}", text)


def _fp8(fmt: WeightFormat, shape, numel, rows, cols) -> TensorBytes:
    if fmt.block is None:
        return TensorBytes(numel, 4, "fp8", f"{numel:,} × 1 + 4 (one fp32 scale)")
    block_rows, block_cols = fmt.block
    matrix_rows = shape[-2] if len(shape) >= 2 else 1
    matrices = numel // (matrix_rows * cols) if matrix_rows * cols else 1
    scales = matrices * -(-matrix_rows // block_rows) * -(-cols // block_cols)
    each = "" if matrices == 1 else f"{matrices:,} × "
    text = (f"{numel:,} × 1 + {each}⌈{matrix_rows:,}/{block_rows}⌉·⌈{cols:,}/{block_cols}⌉ = {scales:,} "
            "block scales × 4")
    return TensorBytes(numel, scales * 4, "fp8", text)


def _mxfp4(fmt: WeightFormat, shape, numel, rows, cols) -> TensorBytes:
    blocks = -(-numel // 32)
    return TensorBytes(-(-numel // 2), blocks, "mxfp4", f"{numel:,} / 2 + {blocks:,} blocks × 1")


def _gguf(fmt: WeightFormat, shape, numel, rows, cols) -> TensorBytes:
    kind = fmt.quant_type or "q8_0"
    note = ""
    while True:
        per_block, block_bytes, _ = GGUF_TYPES[kind]
        if cols % per_block == 0:
            break
        fallback = _GGUF_FALLBACK.get(kind)
        if fallback is None:  # no block type fits this row length: llama.cpp stores it as F16
            return TensorBytes(numel * 2, 0, "f16 (row length fits no block)", f"{numel:,} × 2")
        kind, note = fallback, " (fallback)"
    blocks = numel // per_block
    # A block's scales are part of its bytes; the share beyond the packed values is overhead.
    bits = {"q4_0": 4, "q4_1": 4, "q5_0": 5, "q5_1": 5, "q8_0": 8, "q2_k": 2, "q3_k": 3, "q4_k": 4,
            "q5_k": 5, "q6_k": 6, "iq4_nl": 4, "iq4_xs": 4, "iq3_s": 3}[kind]
    data = numel * bits // 8
    return TensorBytes(data, blocks * block_bytes - data, f"{kind}{note}",
                       f"{blocks:,} blocks of {per_block} × {block_bytes} B")


_LAYOUTS = {"plain": _plain, "bnb4": _bnb4, "int8": _int8, "gptq": _gptq, "awq": _awq, "fp8": _fp8,
            "mxfp4": _mxfp4, "gguf": _gguf}

# --- the names users type --------------------------------------------------------------------------------------

# llama.cpp's mixtures (llama_ftype) offered as --dtype, with their default ggml type; llama_cpp_mixture.py types each
# tensor. A name that is both a mixture and a ggml type (q4_0, q8_0, q6_k, iq4_xs, ...) is the mixture, as
# `llama-quantize … Q4_0` writes it; q3_k, q4_k and q5_k stay one type for every matrix (`llama-quantize --pure`).
GGUF_MIXTURES: dict[str, str] = {
    "q4_0": "q4_0", "q4_1": "q4_1", "q5_0": "q5_0", "q5_1": "q5_1", "q8_0": "q8_0", "q2_k": "q2_k",
    "q3_k_s": "q3_k", "q3_k_m": "q3_k", "q3_k_l": "q3_k", "q4_k_s": "q4_k", "q4_k_m": "q4_k", "q5_k_s": "q5_k",
    "q5_k_m": "q5_k", "q6_k": "q6_k", "iq4_nl": "iq4_nl", "iq4_xs": "iq4_xs", "iq3_s": "iq3_s", "iq3_m": "iq3_s",
}

FORMAT_CHOICES = ("fp32", "bf16", "fp16", "fp8", "fp8-block", "int8", "int4", "nf4", "nf4-dq", "fp4", "fp4-dq",
                  "gptq-int2", "gptq-int3", "gptq-int4", "gptq-int8", "awq-int4", "mxfp4",
                  *dict.fromkeys([*GGUF_MIXTURES, *GGUF_TYPES]))


def weight_format(name: str, *, compute_dtype: str = "bfloat16", group_size: int | None = None) -> WeightFormat:
    """The format the user named with --dtype. `compute_dtype` holds what a quantised format leaves unquantised."""
    gguf_key = str(name).strip().lower().replace("-", "_")
    if gguf_key in GGUF_MIXTURES:
        kind = GGUF_MIXTURES[gguf_key]
        per, size, _ = GGUF_TYPES[kind]
        return WeightFormat(gguf_key, "gguf", f"llama.cpp {gguf_key.upper()} mixture (default type {kind.upper()}, "
                            f"{size * 8 / per:g} bits per weight; each tensor's type by llama.cpp's "
                            "llama_tensor_get_type), 1-D tensors, norms and routers F32", "float32", "matrices",
                            quant_type=kind, mixture=gguf_key.upper())
    key = str(name).strip().lower().replace("_", "-") if str(name).lower() not in GGUF_TYPES else str(name).lower()
    key = {"int4": "nf4", "llm.int8": "int8", "llm-int8": "int8", "fp8-block128": "fp8-block"}.get(key, key)
    if key.replace("-", "_") in GGUF_TYPES:
        kind = key.replace("-", "_")
        per, size, holds = GGUF_TYPES[kind]
        return WeightFormat(kind, "gguf", f"GGUF {kind.upper()} in every matrix, as llama-quantize --pure ({size} B "
                            f"per {per} weights: {holds}; {size * 8 / per:g} bits per weight), 1-D tensors and "
                            "routers F32",
                            "float32", "matrices", quant_type=kind)
    if key in ("fp32", "bf16", "fp16") or key in DTYPE_NAMES and DTYPE_NAMES[key] in ("float32", "bfloat16",
                                                                                       "float16", "float64"):
        dtype = DTYPE_NAMES[key]
        return WeightFormat(short_name(dtype), "plain", f"{short_name(dtype)} ({itemsize(dtype)} bytes per "
                            "parameter)", dtype)
    if key in ("nf4", "nf4-dq", "fp4", "fp4-dq"):
        quant_type, double = key[:3], key.endswith("-dq")
        dq = ", double quantisation" if double else ""
        return WeightFormat(key, "bnb4", f"bitsandbytes 4-bit {quant_type.upper()}{dq} (blocks of 64)",
                            compute_dtype, "linear", bits=4, double_quant=double, quant_type=quant_type)
    if key == "int8":
        return WeightFormat("int8", "int8", "bitsandbytes LLM.int8 (1 byte per weight, fp32 scale per row)",
                            compute_dtype, "linear", bits=8)
    if key.startswith(("gptq-int", "awq-int")):
        method, _, bits_text = key.partition("-int")
        bits = int(bits_text) if bits_text.isdigit() else 0
        if bits not in ((2, 3, 4, 8) if method == "gptq" else (4,)):
            raise UnsupportedError(f"unsupported {method.upper()} width {key!r}")
        group = 128 if group_size is None else group_size
        group_text = "per-channel" if group <= 0 else f"group size {group}"
        return WeightFormat(key, method, f"{method.upper()} int{bits}, {group_text}", compute_dtype, "linear",
                            bits=bits, group_size=group if group > 0 else None)
    if key in ("fp8", "fp8-block"):
        block = (128, 128) if key == "fp8-block" else None
        scales = "128×128 block scales" if block else "one scale per tensor"
        return WeightFormat(key, "fp8", f"fp8 e4m3 (1 byte per weight, {scales})", compute_dtype,
                            "linear+experts", bits=8, block=block)
    if key == "mxfp4":
        return WeightFormat("mxfp4", "mxfp4", "MXFP4 (4-bit e2m1, one 8-bit scale per block of 32)", compute_dtype,
                            "experts", bits=4)
    raise OptionError("unknown {0} {name!r}; use one of {choices}", "dtype", name=str(name)[:40],
                      choices=", ".join(FORMAT_CHOICES))


