"""The storage a checkpoint's config declares (`quantization_config`, else its dtype) as a WeightFormat.

Apart from quantization.py because compressed-tensors' format (compressed_tensors.py) is itself built on
quantization.py's WeightFormat: this module reads the config and picks among them.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ...errors import ParamscopeError, UnsupportedError
from ..dtypes import DTYPE_NAMES, short_name
from .compressed_tensors import compressed_tensors_format
from .quantization import FORMAT_CHOICES, WeightFormat, weight_format


def declared_format(config: dict[str, Any] | None) -> tuple[WeightFormat, str, tuple[str, ...]]:
    """The storage a checkpoint's config declares: (format, where it came from, modules_to_not_convert).

    `quantization_config` first, then `torch_dtype` / `dtype`; with neither, float32, what transformers loads a
    config without a dtype in."""
    config = config if isinstance(config, dict) else {}
    dtype = config.get("torch_dtype") or config.get("dtype")
    if not isinstance(dtype, str) and isinstance(config.get("text_config"), dict):
        dtype = config["text_config"].get("torch_dtype") or config["text_config"].get("dtype")
    dtype = DTYPE_NAMES.get(str(dtype).removeprefix("torch.").lower()) if isinstance(dtype, str) else None
    compute = dtype if dtype in ("float32", "bfloat16", "float16") else "bfloat16"
    quant = config.get("quantization_config")
    if isinstance(quant, dict):
        method = str(quant.get("quant_method") or "").lower()
        skip = quant.get("modules_to_not_convert") or quant.get("ignored_layers") or ()
        skip = tuple(str(s) for s in skip) if isinstance(skip, (list, tuple)) else ()
        fmt = _declared_quantized(method, quant, compute)
        if fmt is None:
            raise UnsupportedError("the config declares quant_method {method!r}, which paramscope does not model; choose "
                                   "a storage with {0} ({choices}, …)", "dtype", method=method or "unknown",
                                   choices=", ".join(FORMAT_CHOICES[:6]))
        return replace(fmt, declared=True), f"the config's quantization_config ({method})", skip
    if dtype == "float64":  # transformers loads it in float64; no storage format here is 8 bytes a weight
        raise UnsupportedError("the config declares dtype float64, which paramscope's memory does not model; choose "
                               "a storage with {0} ({choices}, …)", "dtype", choices=", ".join(FORMAT_CHOICES[:6]))
    if dtype in ("float32", "bfloat16", "float16"):
        key = "torch_dtype" if config.get("torch_dtype") else "dtype"
        return replace(weight_format(short_name(dtype)), declared=True), f"the config's {key}", ()
    return weight_format("fp32"), "no dtype declared: transformers loads float32", ()


def _declared_quantized(method: str, quant: dict[str, Any], compute: str) -> WeightFormat | None:
    if method == "bitsandbytes" or any(k in quant for k in ("load_in_4bit", "_load_in_4bit", "load_in_8bit")):
        if quant.get("load_in_4bit") or quant.get("_load_in_4bit"):
            kind = str(quant.get("bnb_4bit_quant_type") or "fp4").lower()
            double = "-dq" if quant.get("bnb_4bit_use_double_quant") else ""
            return weight_format(f"{kind if kind in ('nf4', 'fp4') else 'fp4'}{double}", compute_dtype=compute)
        return weight_format("int8", compute_dtype=compute)
    if method in ("gptq", "awq"):
        bits = quant.get("bits") or quant.get("w_bit") or 4
        group = quant.get("group_size") if "group_size" in quant else quant.get("q_group_size", 128)
        group = group if isinstance(group, int) and not isinstance(group, bool) else 128
        try:
            return weight_format(f"{method}-int{int(bits)}", compute_dtype=compute, group_size=group)
        except (ParamscopeError, TypeError, ValueError):
            return None
    if method in ("fp8", "finegrained_fp8"):
        block = quant.get("weight_block_size")
        fmt = weight_format("fp8", compute_dtype=compute)
        if isinstance(block, (list, tuple)) and len(block) == 2 and all(
                isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block):
            size = f"{block[0]}×{block[1]}"
            fmt = replace(fmt, key="fp8-block", block=(block[0], block[1]),
                          label=f"fp8 e4m3 (1 byte per weight, {size} block scales)")
        return fmt
    if method == "mxfp4":
        return weight_format("mxfp4", compute_dtype=compute)
    if method == "compressed-tensors":  # each linear as the checkpoint stores it, by the config's groups
        return compressed_tensors_format(quant, compute)
    return None
