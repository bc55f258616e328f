"""Quantised checkpoints: which stored tensors are packed weights and which are quantisation bookkeeping (scales,
zero points, state), recognised from names and shapes alone.
"""

from __future__ import annotations

import re
from operator import attrgetter
from typing import Any

from .tensors import CheckpointTensor, make_tensor

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
    "weight_g_idx": ("compressed-tensors", "activation-order group index"),
}
_BNB4_STATE = re.compile(
    r"^(?P<weight>.+\.weight)\.(absmax|quant_map|nested_absmax|nested_quant_map|quant_state\..+)$"
)
_GPTQ_PARTS = ("qzeros", "scales", "g_idx")
# Every last name component that classify_quantisation marks (besides bitsandbytes 4-bit state, under ".weight.").
_MARKED_LAST = frozenset(_AUX_SUFFIXES) | {"SCB", "weight_format", "qweight", "weight_packed", *_GPTQ_PARTS}
# gpt-oss's MXFP4 experts (transformers' integrations/mxfp4.py): `X_blocks` U8 [..., n/32, 16], 32 fp4 values in
# each 16-byte block, beside `X_scales` U8 [..., n/32], one e8m0 exponent a block.
_MXFP4_ENDINGS = ("_blocks", "_scales")
_name = attrgetter("name")


def classify_quantisation(tensors: list[CheckpointTensor]) -> list[CheckpointTensor]:
    """Mark packed weights and their scale/zero/state tensors, from names and shapes alone.

    Recognised: bitsandbytes 4-bit (``X.weight`` U8 with ``X.weight.absmax``/``.quant_state.*``),
    bitsandbytes 8-bit (``X.SCB``), GPTQ/AWQ (``X.qweight`` with ``X.qzeros``/``X.scales``),
    compressed-tensors (``X.weight_packed``: int32 words of 1-8-bit integers, or uint8 of two fp4 values),
    MXFP4 (``X_blocks`` with ``X_scales``) and fp8 scales (``X.weight_scale[_inv]``, ``X.input_scale``).
    """
    # Only names ending in one of these, or holding ".weight.", can be marked: most checkpoints hold none of them, and
    # a 100 MB header lists a million names.
    candidates = [i for i, t in enumerate(tensors) if t.name.rpartition(".")[2] in _MARKED_LAST or ".weight." in t.name
                  or t.name.endswith(_MXFP4_ENDINGS)]
    if not candidates:
        return tensors
    index = dict(zip(map(_name, tensors), range(len(tensors))))  # name → position, built by C loops
    out = list(tensors)
    marked = False

    def mark(i: int, role: str, packing: str, note: str, logical_numel: Any = None) -> None:
        # the tensor at `i` as it was read, with these fields: the last mark of a tensor is what it becomes
        nonlocal marked
        t = tensors[i]
        out[i] = make_tensor(t.name, t.dtype, t.shape, t.numel, t.nbytes, t.file, role, logical_numel, packing, note)
        marked = True

    def named(name: str) -> CheckpointTensor | None:
        i = index.get(name)
        return None if i is None else tensors[i]

    for i in candidates:
        t = tensors[i]
        stem, _, last = t.name.rpartition(".")
        prefix = f"{stem}." if stem else ""
        if last in _AUX_SUFFIXES:
            scheme, what = _AUX_SUFFIXES[last]
            mark(i, role="quant_aux", packing=scheme, note=what)
        m = _BNB4_STATE.match(t.name) if ".weight." in t.name else None  # the pattern needs ".weight."
        if m and m["weight"] in index:
            mark(i, role="quant_aux", packing="bnb-4bit", note="bitsandbytes 4-bit state")
            w = index[m["weight"]]
            if tensors[w].dtype == "U8":
                mark(w, role="packed", packing="bnb-4bit", logical_numel=None,
                     note="bitsandbytes 4-bit, 2 values per byte; the exact count is in quant_state data")
        if last in ("SCB", "weight_format") and f"{prefix}weight" in index:
            mark(i, role="quant_aux", packing="bnb-8bit", note="bitsandbytes 8-bit scale")
        if last in _GPTQ_PARTS and f"{prefix}qweight" in index:
            mark(i, role="quant_aux", packing="gptq", note="GPTQ/AWQ scale, zero point or group index")
        if last == "qweight":
            mark(i, role="packed", packing="gptq",
                 logical_numel=_gptq_logical(t, named(f"{prefix}scales"), named(f"{prefix}qzeros")),
                 note="GPTQ/AWQ int32-packed weight")
        if last == "weight_packed" and t.dtype == "U8":  # nvfp4/mxfp4-pack-quantized: in % 16 == 0, no padding
            mark(i, role="packed", packing="compressed-tensors", logical_numel=2 * t.numel,
                 note="compressed-tensors fp4 weight, 2 values per byte")
        elif last == "weight_packed":
            mark(i, role="packed", packing="compressed-tensors", logical_numel=None,
                 note="compressed-tensors packed weight; the unpacked shape is in weight_shape data")
        if last.endswith("_blocks") and f"{prefix}{last[:-7]}_scales" in index:
            if t.dtype == "U8" and len(t.shape) >= 2 and t.shape[-1] == 16:
                mark(i, role="packed", packing="mxfp4", logical_numel=2 * t.numel,
                     note="MXFP4, 32 fp4 values in each 16-byte block")
        if last.endswith("_scales") and last != "_scales" and f"{prefix}{last[:-7]}_blocks" in index:
            mark(i, role="quant_aux", packing="mxfp4", note="MXFP4 block scale (e8m0)")
    return out if marked else tensors


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
