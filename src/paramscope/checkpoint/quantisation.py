"""Quantised checkpoints: which stored tensors are packed weights and which are quantisation bookkeeping (scales,
zero points, state), recognised from names and shapes alone.
"""

from __future__ import annotations

import re
from typing import Any

from .tensors import CheckpointTensor

# Names that are quantisation bookkeeping whatever sits next to them (fp8, NVFP4, compressed-tensors,
# kv-cache scales): suffix -> (scheme, what it is).
_AUX_SUFFIXES = {
    "weight_scale": ("fp8", "quantisation scale"),
    "weight_scale_inv": ("fp8", "quantisation scale"),
    "weight_scale_2": ("fp8", "quantisation scale"),
    "input_scale": ("fp8", "activation quantisation scale"),
    "output_scale": ("fp8", "activation quantisation scale"),
    "k_scale": ("fp8", "kv-cache quantisation scale"),
    "v_scale": ("fp8", "kv-cache quantisation scale"),
    "weight_zero_point": ("compressed-tensors", "quantisation zero point"),
    "weight_global_scale": ("compressed-tensors", "quantisation scale"),
    "input_global_scale": ("compressed-tensors", "activation quantisation scale"),
    "weight_shape": ("compressed-tensors", "record of a packed weight's shape"),
}
_BNB4_STATE = re.compile(
    r"^(?P<weight>.+\.weight)\.(absmax|quant_map|nested_absmax|nested_quant_map|quant_state\..+)$"
)
_GPTQ_PARTS = ("qzeros", "scales", "g_idx")


def classify_quantisation(tensors: list[CheckpointTensor]) -> list[CheckpointTensor]:
    """Mark packed weights and their scale/zero/state tensors, from names and shapes alone.

    Recognised: bitsandbytes 4-bit (``X.weight`` U8 with ``X.weight.absmax``/``.quant_state.*``),
    bitsandbytes 8-bit (``X.SCB``), GPTQ/AWQ (``X.qweight`` with ``X.qzeros``/``X.scales``),
    compressed-tensors (``X.weight_packed``) and fp8 scales (``X.weight_scale[_inv]``, ``X.input_scale``).
    """
    by_name = {t.name: t for t in tensors}
    updates: dict[str, dict[str, Any]] = {}

    for t in tensors:
        stem, _, last = t.name.rpartition(".")
        prefix = f"{stem}." if stem else ""
        if last in _AUX_SUFFIXES:
            scheme, what = _AUX_SUFFIXES[last]
            updates[t.name] = {"role": "quant_aux", "packing": scheme, "note": what}
        m = _BNB4_STATE.match(t.name) if ".weight." in t.name else None  # the pattern needs ".weight."
        if m and m["weight"] in by_name:
            updates[t.name] = {"role": "quant_aux", "packing": "bnb-4bit", "note": "bitsandbytes 4-bit state"}
            weight = by_name[m["weight"]]
            if weight.dtype == "U8":
                updates[weight.name] = {
                    "role": "packed",
                    "packing": "bnb-4bit",
                    "logical_numel": None,
                    "note": "bitsandbytes 4-bit, 2 values per byte; the exact count is in quant_state data",
                }
        if last in ("SCB", "weight_format") and f"{prefix}weight" in by_name:
            updates[t.name] = {"role": "quant_aux", "packing": "bnb-8bit", "note": "bitsandbytes 8-bit scale"}
        if last in _GPTQ_PARTS and f"{prefix}qweight" in by_name:
            updates[t.name] = {
                "role": "quant_aux",
                "packing": "gptq",
                "note": "GPTQ/AWQ scale, zero point or group index",
            }
        if last == "qweight":
            updates[t.name] = {
                "role": "packed",
                "packing": "gptq",
                "logical_numel": _gptq_logical(t, by_name.get(f"{prefix}scales"), by_name.get(f"{prefix}qzeros")),
                "note": "GPTQ/AWQ int32-packed weight",
            }
        if last == "weight_packed":
            updates[t.name] = {
                "role": "packed",
                "packing": "compressed-tensors",
                "logical_numel": None,
                "note": "compressed-tensors packed weight; the unpacked shape is in weight_shape data",
            }
    if not updates:
        return tensors
    out = []
    for t in tensors:
        change = updates.get(t.name)
        if change:
            fields = {k: getattr(t, k) for k in ("name", "dtype", "shape", "numel", "nbytes", "file")}
            fields.setdefault("logical_numel", None)
            fields.update(change)
            t = CheckpointTensor(**fields)
        out.append(t)
    return out


def _gptq_logical(
    qweight: CheckpointTensor, scales: CheckpointTensor | None, qzeros: CheckpointTensor | None
) -> int | None:
    # qweight packs 32/bits values per int32 and qzeros packs the same way over `scales`' columns,
    # so scales_cols / qzeros_cols is the pack factor, for GPTQ and AWQ layouts alike.
    if scales is None or qzeros is None or qweight.dtype != "I32":
        return None
    if len(scales.shape) != 2 or len(qzeros.shape) != 2 or qzeros.shape[1] == 0:
        return None
    packed_values = qweight.numel * scales.shape[1]
    if packed_values % qzeros.shape[1]:
        return None
    return packed_values // qzeros.shape[1]
