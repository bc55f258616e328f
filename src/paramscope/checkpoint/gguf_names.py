"""GGUF tensor names ↔ a transformers class's parameter names, as llama.cpp's converter and transformers map them.

`gguf.get_tensor_name_map(arch, blocks)` is the table convert_hf_to_gguf.py renames a checkpoint with (and
transformers' `get_gguf_hf_weights_map` reads it backwards, as here): `model.layers.3.self_attn.q_proj` →
`blk.3.attn_q`. On top of it, the few ways a GGUF tensor is not one parameter under another name:

- fused experts: transformers 5 keeps a MoE layer's experts as one `experts.gate_up_proj` [E, 2·I, H], llama.cpp
  as `ffn_gate_exps` and `ffn_up_exps` [E, I, H] each (transformers' Qwen2MoeTensorProcessor concatenates them, gate
  first, along dim 1);
- llama.cpp's rope permutation of `attn_q`/`attn_k` rows (convert_hf_to_gguf.py's LlamaModel.permute; reversed by
  transformers' LlamaTensorProcessor): values move, the shape stays;
- a weight stored the other way round (GPT-2's Conv1D [in, out] as ggml's [out, in]);
- the recurrent (SSM) tensors: `A_log` and `D` have no `.weight` suffix in the checkpoint, and the converter's
  `map_tensor_name` keeps that, writing bare `blk.N.ssm_a` (holding −exp(A_log), same shape) and `blk.N.ssm_d`, as
  llama-model.cpp creates them (`tn(LLM_TENSOR_SSM_A, i)`, no suffix); Mamba-2's `dt_bias` is renamed
  `dt_proj.bias` first (Mamba2Model.modify_tensors): `blk.N.ssm_dt.bias`; `conv1d.weight` loses its unit dim
  ([d_inner, 1, d_conv] → [d_inner, d_conv]) and Mamba-2's A, D and norm are reshaped, values and count kept;
- LFM2's short convolution `conv.conv.weight` [H, 1, L] is written squeezed, `blk.N.shortconv.conv.weight` [H, L];
- Granite-4 hybrid (granitehybrid): transformers 5's `block_sparse_moe.router` and `experts.gate_up_proj` /
  `experts.down_proj`, and the shared MLP's fused `input_linear` [2·S, H], have no name in gguf's table:
  GraniteMoeModel.modify_tensors splits input_linear by rows into `ffn_gate_shexp` and `ffn_up_shexp` (or
  `ffn_gate` and `ffn_up` with no experts, its output_linear then `ffn_down`), the experts into `ffn_*_exps`;
- MLA's `kv_b_proj` [heads·(nope + v), rank], split per head by today's converter into `attn_k_b` [heads, rank, nope]
  (transposed) and `attn_v_b` [heads, v, rank] (`stored_gguf_names`).

The role of a GGUF name alone is `gguf_read.gguf_role`; `parameter_gguf_names` is the name-level map other modules
(quantisation mixtures, memory) share.
"""

from __future__ import annotations

import functools
import re
from typing import Any

from ..errors import SourceError
from ..errors import short_repr as _q

# llama.cpp architectures whose converter permutes attn_q/attn_k rows for its rope (LlamaModel.permute), as
# transformers' TENSOR_PROCESSORS reverse them ("llama": LlamaTensorProcessor).
# GraniteHybridModel (and its NemotronHModel) sets undo_permute and runs LlamaModel.modify_tensors on its attention
# layers.
ROPE_PERMUTED = frozenset({"llama", "granitehybrid", "nemotron_h", "nemotron_h_moe"})
_FUSED = ".experts.gate_up_proj"
# llama.cpp tensors written and loaded without a suffix (a checkpoint parameter with none: A_log, D)
_BARE = ("ssm_a", "ssm_d")
_KV_B = ".attn_kv_b.weight"
_GATE_UP_EXPS = ".ffn_gate_up_exps.weight"
_SSM_IN = ".ssm_in.weight"
# GraniteMoeModel.modify_tensors (and its GraniteHybridModel): the class's stem after `layers.N.` → the
# gguf.MODEL_TENSOR names it writes, the file's other layout (no experts: the shared MLP as a dense FFN) after
_GRANITE_ARCHS = frozenset({"granitehybrid"})
# Architectures whose checkpoints name the trunk `backbone.` where transformers 5's class says `model.` (Nemotron-H)
_BACKBONE_ARCHS = frozenset({"nemotron_h", "nemotron_h_moe"})
# NemotronHModel.modify_tensors (is_moe) stacks the experts and renames them `model.layers.N.mlp.experts.{up,down}_proj`
# before mapping; transformers 5's NemotronH holds them as `mixer.experts.{up,down}_proj` [E, out, in]
_NEMOTRON_EXPERTS = re.compile(r"^model\.layers\.(\d+)\.mixer\.experts\.(up_proj|down_proj)$")
_GRANITE_STEMS: dict[str, tuple[tuple[str, ...], ...]] = {
    "block_sparse_moe.router": (("FFN_GATE_INP",),),
    "block_sparse_moe.experts.gate_up_proj": (("FFN_GATE_EXP", "FFN_UP_EXP"),),
    "block_sparse_moe.experts.down_proj": (("FFN_DOWN_EXP",),),
    "shared_mlp.input_linear": (("FFN_GATE_SHEXP", "FFN_UP_SHEXP"), ("FFN_GATE", "FFN_UP")),
    "shared_mlp.output_linear": (("FFN_DOWN_SHEXP",), ("FFN_DOWN",)),
}
_LAYER_STEM = re.compile(r"(?:^|\.)layers\.(\d+)\.(.+)$")


def gguf_arch(architecture: str) -> Any:
    """gguf's MODEL_ARCH member for llama.cpp's architecture name, or SourceError naming it."""
    from gguf import MODEL_ARCH_NAMES

    for member, name in MODEL_ARCH_NAMES.items():
        if name == architecture:
            return member
    raise SourceError(f"architecture {_q(architecture)} is not one the installed gguf package knows")


@functools.lru_cache(maxsize=8)
def _name_map(architecture: str, blocks: int) -> Any:
    from gguf import get_tensor_name_map

    return get_tensor_name_map(gguf_arch(architecture), blocks)


def parameter_gguf_names(architecture: str, blocks: int, name: str) -> tuple[str, ...]:
    """The GGUF tensor names that hold the class's parameter `name` (one; two for a fused gate_up_proj, gate
    first); () when llama.cpp's table has none. `blocks`: the model's layers (the table is built per block)."""
    stem, suffix = name, ".weight"
    if name.endswith((".weight", ".bias")):
        stem, _, last = name.rpartition(".")
        suffix = "." + last
    granite = _granite_names(architecture, stem, suffix)
    if granite:
        return granite[0]
    names = _name_map(architecture, blocks)
    m = _LAYER_STEM.search(stem)
    if architecture == "falcon-h1" and m is not None and m[2] == "pre_ff_layernorm":
        # llama.cpp's tensor_mapping.py maps Falcon-H1's pre_ff_layernorm to ffn_norm (FFN_PRE_NORM's and FFN_NORM's
        # name); gguf 0.19's table has no entry for it
        return (f"blk.{int(m[1])}.ffn_norm" + suffix,)
    experts = _NEMOTRON_EXPERTS.match(stem) if architecture == "nemotron_h_moe" else None
    if experts is not None:
        stem = f"model.layers.{experts[1]}.mlp.experts.{experts[2]}"
    elif architecture in _BACKBONE_ARCHS and stem.startswith("model."):
        # transformers 5's NemotronH names its trunk `model.`; gguf's table knows the checkpoint's `backbone.`
        stem = "backbone." + stem[len("model."):]
    if stem.endswith(".dt_bias"):  # Mamba-2: renamed dt_proj.bias before mapping (Mamba2Model.modify_tensors)
        stem, suffix = stem[: -len("dt_bias")] + "dt_proj", ".bias"
    mapped = names.get_name(stem)
    if mapped is not None:
        bare = not name.endswith((".weight", ".bias")) and mapped.rpartition(".")[2] in _BARE
        return (mapped if bare else mapped + suffix,)
    if stem.endswith(_FUSED):
        base = stem[: -len("gate_up_proj")]
        gate, up = names.get_name(base + "gate_proj"), names.get_name(base + "up_proj")
        if gate is not None and up is not None:
            return (gate + suffix, up + suffix)
    return ()


def _granite_names(architecture: str, stem: str, suffix: str) -> tuple[tuple[str, ...], ...]:
    """The GGUF name sets GraniteMoeModel.modify_tensors writes the class's `stem` under, in _GRANITE_STEMS' order;
    () for another parameter or architecture."""
    if architecture not in _GRANITE_ARCHS:
        return ()
    m = _LAYER_STEM.search(stem)
    if m is None or m[2] not in _GRANITE_STEMS:
        return ()
    from gguf import MODEL_TENSOR, TENSOR_NAMES

    return tuple(tuple(TENSOR_NAMES[MODEL_TENSOR[t]].format(bid=int(m[1])) + suffix for t in layout)
                 for layout in _GRANITE_STEMS[m[2]])


def stored_gguf_names(architecture: str, blocks: int, name: str) -> tuple[tuple[str, ...], ...]:
    """Each set of GGUF tensor names a file may hold the class's parameter `name` under, the plain one first: MLA's
    kv_b_proj is `attn_kv_b` in files converted before llama.cpp's absorption optimization and `attn_k_b` +
    `attn_v_b` after it (convert_hf_to_gguf.py's DeepseekV2Model splits it per head, k_b transposed)."""
    stem = name.rpartition(".")[0] if name.endswith((".weight", ".bias")) else name
    granite = _granite_names(architecture, stem, name[len(stem):] or ".weight")
    if granite:
        return granite
    names = parameter_gguf_names(architecture, blocks, name)
    if len(names) == 1 and names[0].endswith(_KV_B):
        stem = names[0][: -len(_KV_B)]
        return (names, (stem + ".attn_k_b.weight", stem + ".attn_v_b.weight"))
    if len(names) == 1 and names[0].endswith(_GATE_UP_EXPS):
        # gguf's table names a fused gate_up_exps, which converters that stack gate and up apart (Qwen2MoeModel and
        # its Qwen3NextModel) do not write
        stem = names[0][: -len(_GATE_UP_EXPS)]
        return (names, (stem + ".ffn_gate_exps.weight", stem + ".ffn_up_exps.weight"))
    if len(names) == 1 and names[0].endswith(_SSM_IN) and name.endswith(".in_proj_qkvz.weight"):
        # Qwen3NextModel.modify_tensors: in_proj_qkvz regrouped and split into attn_qkv (q‖k‖v) and attn_gate (z)
        stem = names[0][: -len(_SSM_IN)]
        return (names, (stem + ".attn_qkv.weight", stem + ".attn_gate.weight"))
    return (names,) if names else ()


def how_stored(architecture: str, gguf_names: tuple[str, ...], gguf_shapes: tuple[tuple[int, ...], ...],
               shape: tuple[int, ...]) -> str | None:
    """How the GGUF tensors hold a parameter of `shape`, in words ("as is", "rows permuted for rope, shape kept",
    "fused: ..."), or None when their shapes cannot be that parameter's."""
    if len(gguf_names) == 2 and gguf_names[0].endswith(".attn_k_b.weight"):
        k, v = gguf_shapes  # [heads, rank, nope] and [heads, v, rank] for the class's [heads·(nope + v), rank]
        if len(k) == len(v) == 3 and len(shape) == 2 and k[0] == v[0] and k[1] == v[2] == shape[1] \
                and k[0] * (k[2] + v[1]) == shape[0]:
            return "split per head: attn_k_b (transposed) ‖ attn_v_b (convert_hf_to_gguf.py's MLA absorption)"
        return None
    if len(gguf_names) == 2 and gguf_names[0].endswith(".attn_qkv.weight"):
        qkv, z = gguf_shapes  # [q + k + v rows, hidden] and [z rows, hidden] for the class's [q + k + v + z, hidden]
        if len(qkv) == len(z) == len(shape) == 2 and qkv[1] == z[1] == shape[1] and qkv[0] + z[0] == shape[0]:
            return ("split by rows: attn_qkv (q ‖ k ‖ v) and attn_gate (z), heads regrouped "
                    "(convert_hf_to_gguf.py's Qwen3-Next), values kept")
        return None
    if len(gguf_names) == 2 and architecture in _GRANITE_ARCHS and ("_shexp." in gguf_names[0]
                                                                   or ".ffn_gate." in gguf_names[0]):
        a, b = gguf_shapes  # [S, hidden] each for the class's input_linear [2·S, hidden]
        if len(a) == len(b) == len(shape) == 2 and a == b and (2 * a[0], a[1]) == tuple(shape):
            return ("split by rows: gate ‖ up (convert_hf_to_gguf.py's GraniteMoeModel splits the shared MLP's "
                    "input_linear), values kept")
        return None
    if len(gguf_names) == 2:
        a, b = gguf_shapes
        if len(a) == len(shape) == 3 and a == b and (a[0], 2 * a[1], a[2]) == tuple(shape):
            return "fused: gate ‖ up along dim 1 (transformers' gate_up_proj)"
        return None
    (got,) = gguf_shapes
    if tuple(got) == tuple(shape):
        name = gguf_names[0]
        if architecture in ROPE_PERMUTED and (".attn_q." in name or ".attn_k." in name) and len(shape) == 2:
            return "rows permuted for rope (convert_hf_to_gguf.py), shape kept"
        if name.endswith(".ssm_a"):
            return "holds −exp(A_log) (convert_hf_to_gguf.py), shape kept"
        return "as is"
    if len(shape) == 2 and tuple(got) == tuple(reversed(shape)):
        return "transposed (ggml's [out, in]; the class holds [in, out])"
    if ".ssm_" in gguf_names[0] and _count(got) == _count(shape):
        return f"reshaped {list(shape)} → {list(got)} (convert_hf_to_gguf.py's SSM layout), values kept"
    if ".shortconv.conv." in gguf_names[0] and tuple(got) == tuple(d for d in shape if d != 1):
        return f"squeezed {list(shape)} → {list(got)} (convert_hf_to_gguf.py's LFM2 conv), values kept"
    if tuple(got) == tuple(d for d in shape if d != 1):  # the converter squeezes the float tensors it writes
        return f"squeezed {list(shape)} → {list(got)} (convert_hf_to_gguf.py), values kept"
    return None


def _count(shape: tuple[int, ...]) -> int:
    total = 1
    for size in shape:
        total *= int(size)
    return total
