"""How a checkpoint stores its weights, read from config.json alone: declared dtype and quantization_config.

Counting never applies quantisation: the model is built from the config with `quantization_config` removed,
so no quantisation backend (bitsandbytes, auto-gptq, fbgemm, …) is imported or needed, and the counts are
logical parameters (an int4 GPTQ weight of 4096×4096 counts 16,777,216, not the int32 words that pack it).
This module only describes the storage, e.g. "fp8 (e4m3) weights, 1 byte each, block-wise scales (128×128)".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

_DTYPE_BYTES = {
    "float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2, "float64": 8,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "int8": 1, "uint8": 1,
}


@dataclass(frozen=True)
class Storage:
    dtype: str | None  # declared torch_dtype / dtype, e.g. "bfloat16"
    quant_method: str | None  # quantization_config.quant_method, e.g. "fp8", "gptq", "bitsandbytes"
    bits: float | None  # bits per quantised weight, when the config says
    description: str  # one line, e.g. "fp8 (e4m3) weights, 1 byte each, block-wise scales (128×128)"
    unquantized: tuple[str, ...] = ()  # modules the config keeps in full precision


def describe_storage(config: dict[str, Any] | None) -> Storage | None:
    """The storage of the checkpoint `config` describes, or None when it declares neither dtype nor quantisation."""
    if not isinstance(config, dict):
        return None
    dtype = config.get("torch_dtype") or config.get("dtype")
    dtype = dtype if isinstance(dtype, str) else None
    quant = config.get("quantization_config")
    if not isinstance(quant, dict):
        if dtype is None:
            return None
        size = _DTYPE_BYTES.get(dtype.removeprefix("torch."))
        each = f", {size} byte{'s' if size != 1 else ''} each" if size else ""
        return Storage(dtype, None, None, f"{dtype} weights{each} (declared dtype; no quantisation)")
    method = str(quant.get("quant_method") or _guess_method(quant) or "unknown")
    bits, text = _describe(method.lower(), quant)
    unquantized = quant.get("modules_to_not_convert") or quant.get("ignored_layers") or quant.get("ignore") or ()
    if not isinstance(unquantized, (list, tuple)):
        unquantized = ()
    unquantized = tuple(str(m) for m in unquantized)
    if unquantized:
        shown = ", ".join(unquantized[:3]) + (f" and {len(unquantized) - 3} more" if len(unquantized) > 3 else "")
        text += f"; kept unquantised: {shown}"
    if dtype:
        text += f"; other tensors {dtype}"
    return Storage(dtype, method, bits, text, unquantized)


def _guess_method(quant: dict[str, Any]) -> str | None:
    if any(k in quant for k in ("load_in_4bit", "load_in_8bit", "_load_in_4bit", "_load_in_8bit")):
        return "bitsandbytes"
    return None


def _bytes(bits: float) -> str:
    value = bits / 8
    text = f"{value:g}"
    return f"{text} byte" + ("" if value == 1 else "s")


def _group(quant: dict[str, Any], *keys: str) -> str:
    for key in keys:
        size = quant.get(key)
        if isinstance(size, int):
            return "per-channel scales" if size <= 0 else f"group-wise scales (groups of {size})"
    return "group-wise scales"


def _describe(method: str, quant: dict[str, Any]) -> tuple[float | None, str]:
    if method in ("fp8", "fbgemm_fp8", "finegrained_fp8"):
        fmt = quant.get("fmt") or quant.get("weight_format")
        block = quant.get("weight_block_size")
        if isinstance(block, (list, tuple)) and block:
            scales = f"block-wise scales ({'×'.join(str(b) for b in block)} blocks)"
        elif method == "fbgemm_fp8":
            scales = "per-channel scales"
        else:
            scales = "per-tensor scales"
        name = f"fp8 ({fmt})" if fmt else "fp8"
        extra = ""
        if quant.get("activation_scheme"):
            extra = f", {quant['activation_scheme']} activation scales"
        return 8, f"{name} weights, 1 byte each, {scales}{extra}"
    if method in ("gptq", "awq"):
        bits = quant.get("bits") or quant.get("w_bit") or 4
        label = method.upper()
        per_word = 32 // bits if isinstance(bits, int) and bits and 32 % bits == 0 else None
        packed = f", packed {per_word} per int32" if per_word else ""
        zeros = "scales and zero points" if method == "gptq" or quant.get("zero_point", True) else "scales"
        group = _group(quant, "group_size", "q_group_size").replace("scales", zeros)
        return float(bits), f"{label} int{bits} weights{packed} ({_bytes(float(bits))} each), {group}"
    if method == "bitsandbytes":
        if quant.get("load_in_4bit") or quant.get("_load_in_4bit"):
            kind = str(quant.get("bnb_4bit_quant_type") or "fp4").upper()
            double = ", scales quantised again (double quantisation)" if quant.get("bnb_4bit_use_double_quant") else ""
            return 4, f"bitsandbytes 4-bit {kind} weights (0.5 bytes each), block-wise absmax scales (blocks of 64){double}"
        return 8, "bitsandbytes 8-bit LLM.int8() weights, 1 byte each, per-row scales (outliers kept in 16-bit)"
    if method == "mxfp4":
        return 4, "MXFP4 weights (4-bit e2m1, 0.5 bytes each), one shared 8-bit scale per block of 32"
    if method == "compressed-tensors":
        groups = quant.get("config_groups") or {}
        for group in groups.values() if isinstance(groups, dict) else ():
            weights = group.get("weights") if isinstance(group, dict) else None
            if isinstance(weights, dict) and weights.get("num_bits"):
                bits = weights["num_bits"]
                kind = weights.get("type", "int")
                strategy = weights.get("strategy")
                scales = f", {strategy}-wise scales" if strategy else ""
                return float(bits), f"compressed-tensors {bits}-bit {kind} weights ({_bytes(float(bits))} each){scales}"
        return None, "compressed-tensors quantised weights"
    bits = quant.get("bits") or quant.get("nbits") or quant.get("weights")
    if isinstance(bits, (int, float)) and not isinstance(bits, bool):
        return float(bits), f"{method} {bits}-bit quantised weights ({_bytes(float(bits))} each)"
    return None, f"{method} quantised weights"
