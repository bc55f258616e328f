"""llama.cpp's quantisation mixtures (Q4_K_M, Q5_K_S, Q6_K, IQ4_XS, ...): the ggml type of every tensor, and the
predicted GGUF file's tensor bytes.

A mixture (llama.cpp's `llama_ftype`) is not one type: `llama-quantize` picks each tensor's type in
`llama_tensor_get_type` (src/llama-quant.cpp). This module follows that function as it stands at llama.cpp commit
007dbbf3fd17eefe9b47fee45f48f7ba5e62b714 (ggml-org/llama.cpp), step by step:

- which tensors are quantised at all (`tensor_allows_quantization`): ggml tensors of two or more dimensions (trailing
  dimensions of 1 do not count, `ggml_n_dims`) whose names end in "weight", except norms, routers
  (`ffn_gate_inp`), position and token-type embeddings and conv1d kernels. The rest keep the converter's type:
  F32 for 1-D tensors, norms, biases and routers (convert_hf_to_gguf.py), F16 for any other (its default
  `--outtype f16`; BF16 would be the same bytes);
- the mixture's default type (`llama_ftype_get_default_type`), then its rules by tensor category (the tensor's
  name: output, token_embd, attn_v/attn_qkv/attn_kv_b, attn_k, attn_q, attn_output, ffn_down, ffn_gate, ffn_up):
  the output (and, with tied embeddings, token_embd) to Q6_K; attn_v and ffn_down in `use_more_bits` layers
  (the first and last eighth, and every third between) to Q6_K for Q4_K_M and Q5_K_M; the first attn_v layers for
  Q3_K_M and Q4_K_S; the first eighth of ffn_down for Q4_K_S and IQ4_XS; GQA (n_head / n_head_kv ≥ 4), 8-expert
  and 70B special cases; counters kept over tensors in llama.cpp's order (by layer, then by name);
- the fallback when a row (ne[0]) is no multiple of the chosen type's block (`tensor_type_fallback`): Q4_K → Q5_0,
  Q5_K → Q5_1, Q6_K → Q8_0, Q2_K/Q3_K → Q4_0, IQ4_XS/IQ3_S → IQ4_NL, then F16.

Assumed, as `llama-quantize MODEL-F16.gguf OUT.gguf TYPE` does by default: no --pure, no per-tensor overrides, the
output tensor quantised, and no importance matrix unless asked (`imatrix`: it keeps IQ4_XS/IQ4_NL's first ffn_down
layers and promotes Q4_0/Q5_0's to Q4_1/Q5_1; the K mixtures do not read it). Mixtures that need an importance
matrix for their own types (IQ1/IQ2/IQ3_XXS/IQ3_XS, Q2_K_S) are not offered.
"""

from __future__ import annotations

import functools
import math
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from ...checkpoint.gguf_names import parameter_gguf_names
from ...checkpoint.gguf_read import block_kinds, gguf_role
from ...errors import UnsupportedError
from ...frozen import FrozenDict, freeze_fields
from ...roles import OTHER
from .quantization import GGUF_TYPES, TensorBytes, WeightFormat

LLAMA_CPP_COMMIT = "007dbbf3fd17eefe9b47fee45f48f7ba5e62b714"
SOURCE = f"llama.cpp's llama_tensor_get_type (src/llama-quant.cpp at {LLAMA_CPP_COMMIT[:12]})"

# llama_ftype → its default ggml type (llama_ftype_get_default_type)
MIXTURES: dict[str, str] = {
    "Q4_0": "q4_0", "Q4_1": "q4_1", "Q5_0": "q5_0", "Q5_1": "q5_1", "Q8_0": "q8_0",
    "Q2_K": "q2_k", "Q3_K_S": "q3_k", "Q3_K_M": "q3_k", "Q3_K_L": "q3_k",
    "Q4_K_S": "q4_k", "Q4_K_M": "q4_k", "Q5_K_S": "q5_k", "Q5_K_M": "q5_k", "Q6_K": "q6_k",
    "IQ4_NL": "iq4_nl", "IQ4_XS": "iq4_xs", "IQ3_S": "iq3_s", "IQ3_M": "iq3_s",
}

# tensor_type_fallback: a row no multiple of the type's block takes this type, then F16
# (of the types the mixtures offered here produce; llama.cpp's IQ1/IQ2/IQ3_XXS fall back to IQ4_NL too)
_FALLBACK = {"q2_k": "q4_0", "q3_k": "q4_0", "q4_k": "q5_0", "q5_k": "q5_1", "q6_k": "q8_0",
             "iq4_xs": "iq4_nl", "iq3_s": "iq4_nl"}

# tensor_allows_quantization: name parts that keep a tensor unquantised
_NOT_QUANTISED = ("_norm.weight", "ffn_gate_inp.weight", "ffn_gate_tid2eid.weight", "altup", "laurel",
                  "per_layer_model_proj", "ssm_conv1d", "shortconv.conv.weight", "attn_rel_b.weight",
                  "time_mix_first.weight", "time_mix_w0.weight", "time_mix_w1.weight", "time_mix_w2.weight")
# convert_hf_to_gguf.py: always F32 (besides 1-D tensors, norms and biases)
_CONVERTER_F32 = ("ffn_gate_inp.", "position_embd.", "token_types.", "ssm_conv1d.")
_LAYER = re.compile(r"^blk\.(\d+)\.")
# ggml's float types under the names paramscope's weights tables use for them
_STORAGE = {"F32": "fp32", "F16": "fp16", "BF16": "bf16"}

# --- the converter's tensors ------------------------------------------------------------------------------------

# transformers' model_type → llama.cpp's architecture, where convert_hf_to_gguf.py writes another name than the
# model type (gguf_config.py reads the other way); any other model type that is an architecture name is itself.
_ARCH_OF_MODEL_TYPE = {"mistral": "llama", "mixtral": "llama", "qwen2_moe": "qwen2moe", "qwen3_moe": "qwen3moe",
                       "gemma3_text": "gemma3", "deepseek_v2": "deepseek2", "deepseek_v3": "deepseek2",
                       "gpt_neox": "gptneox", "gpt_oss": "gpt-oss"}
# Per-expert linears (`….experts.3.w1.weight`): the converter stacks a layer's experts into one tensor a projection.
_PER_EXPERT = re.compile(r"^(?P<module>.*\.experts)\.(?P<expert>\d+)\.(?P<proj>\w+)\.weight$")
_STACKED = {"w1": "ffn_gate_exps", "gate_proj": "ffn_gate_exps", "w3": "ffn_up_exps", "up_proj": "ffn_up_exps",
            "w2": "ffn_down_exps", "down_proj": "ffn_down_exps"}
_INDEX = re.compile(r"\.(\d+)\.")
# A fused expert tensor (`….experts.gate_up_proj` [E, 2I, H]) → the GGUF tensors it is written as
_FUSED_EXPERTS = {"gate_up_proj": ("ffn_gate_exps", "ffn_up_exps"), "gate_proj": ("ffn_gate_exps",),
                  "up_proj": ("ffn_up_exps",), "down_proj": ("ffn_down_exps",)}


@dataclass(frozen=True, slots=True)
class GGUFName:
    """One tensor of the file the converter writes, and the parameter(s) it is written from."""

    name: str  # e.g. "blk.3.attn_v.weight"
    shape: tuple[int, ...]  # PyTorch order: shape[-1] is ggml's row, ne[0]
    role: str  # gguf_read.gguf_role of the name (the parameter's own when unmapped)
    sources: tuple[str, ...]
    mapped_by: str  # "converter" (gguf's TensorNameMap), "experts" (stacked), "role", "unmapped"

    @property
    def elements(self) -> int:
        return math.prod(self.shape)


# The config fields the converter's names and llama.cpp's rules read.
_CONFIG_KEYS = ("model_type", "num_attention_heads", "n_head", "num_key_value_heads", "num_local_experts",
                "num_experts", "n_routed_experts", "moe_num_experts", "num_hidden_layers", "hidden_size", "head_dim",
                "rope_scaling", "rope_parameters", "qk_nope_head_dim", "v_head_dim", "kv_lora_rank",
                "layers_block_type")


def config_fields(config: Any) -> dict[str, Any]:
    """The fields of a config dict or object (transformers' config, or the recorded facts' stand-in for it) that
    the prediction reads, as a dict; its text_config likewise."""
    if isinstance(config, dict):
        return config
    if config is None:
        return {}
    out = {key: value for key in _CONFIG_KEYS if (value := getattr(config, key, None)) is not None}
    text = getattr(config, "text_config", None)
    if text is not None and text is not config:
        out["text_config"] = config_fields(text)
    return out


def gguf_arch_of(config: dict[str, Any]) -> str | None:
    """llama.cpp's architecture for a transformers config (or its text_config), when the gguf package has it."""
    import gguf

    known = set(gguf.MODEL_ARCH_NAMES.values())
    for cfg in (config, config.get("text_config")):
        if isinstance(cfg, dict):
            model_type = str(cfg.get("model_type") or "").lower()
            arch = _ARCH_OF_MODEL_TYPE.get(model_type, model_type)
            if arch == "nemotron_h" and "moe" in [str(kind) for kind in cfg.get("layers_block_type") or ()]:
                # convert_hf_to_gguf.py's NemotronHModel writes nemotron_h_moe for a config with experts
                # (Nemotron-3 Nano/Super): the class's "moe" layers
                arch = "nemotron_h_moe"
            if arch in known:
                return arch
    return None


@functools.lru_cache(maxsize=1)
def _base_of_role() -> dict[str, str]:
    """paramscope role → the first GGUF tensor base name (gguf's TENSOR_NAMES) that gguf_read.gguf_role reads as it:
    the names a parameter takes when the converter's table has none for it, from the one role map both share."""
    import gguf

    out: dict[str, str] = {}
    for template in gguf.TENSOR_NAMES.values():
        base = template.removeprefix("blk.{bid}.")
        if "{" not in base:
            out.setdefault(gguf_role(f"{base}.weight"), template)
    return out


def converter_tensors(params: Iterable[Any], config: dict[str, Any], n_layers: int,
                      transposed: frozenset[str] = frozenset(), buffers: Iterable[Any] = ()) -> tuple[GGUFName, ...]:
    """Each parameter (name, shape, role, numel) as the tensor(s) convert_hf_to_gguf.py writes: named by gguf's
    table for the architecture (checkpoint/gguf_names.parameter_gguf_names: a fused gate_up_proj of experts is two
    tensors), per-expert linears stacked, else named by the parameter's role, else unmapped. `transposed`: weights
    the class stores [in, out] (GPT-2's Conv1D), which the converter writes as ggml's [out, in]. `buffers` that
    hold learned values (count.BufferInfo with a role: DeepSeek's router score-correction bias) are written too,
    F32, where the table names them."""
    arch = gguf_arch_of(config)
    out: list[GGUFName] = []
    stacked: dict[tuple[str, str], list[Any]] = {}
    for p in params:
        shape = tuple(int(d) for d in p.shape)
        if p.name in transposed and len(shape) == 2:
            shape = shape[::-1]
        m = _PER_EXPERT.match(p.name)
        if m and m["proj"] in _STACKED:
            stacked.setdefault((m["module"], m["proj"]), []).append(p)
            continue
        names = parameter_gguf_names(arch, max(n_layers, 1), p.name) if arch else ()
        if not names and arch and not p.name.startswith("model."):  # a base model's names (no task head)
            names = parameter_gguf_names(arch, max(n_layers, 1), "model." + p.name)
        module, _, last = p.name.rpartition(".")
        if not names and len(shape) == 3 and (module == "experts" or module.endswith(".experts")) \
                and last in _FUSED_EXPERTS:  # the converter's names for a layer's fused experts
            index = _INDEX.search(p.name)
            names = tuple(f"blk.{int(index.group(1)) if index else 0}.{base}.weight" for base in _FUSED_EXPERTS[last])
        if len(names) == 2 and len(shape) == 3:  # gate ‖ up along dim 1
            half = (shape[0], shape[1] // 2, shape[2])
            out.extend(GGUFName(n, half, gguf_role(n), (p.name,), "converter") for n in names)
            continue
        if len(names) == 1 and names[0].endswith(".attn_kv_b.weight") and _mla_split(config):
            out.extend(_k_b_v_b(names[0], p.name, _mla_split(config)))
            continue
        if len(names) == 1:
            out.append(GGUFName(names[0], shape, gguf_role(names[0]), (p.name,), "converter"))
            continue
        template = _base_of_role().get(p.role)
        index = _INDEX.search(p.name)
        if template is not None and p.role != OTHER and ("{bid}" not in template or index):
            name = template.format(bid=int(index.group(1)) if index else 0) + (
                ".bias" if p.name.endswith(".bias") else ".weight")
            out.append(GGUFName(name, shape, gguf_role(name), (p.name,), "role"))
        else:
            out.append(GGUFName(p.name, shape, p.role, (p.name,), "unmapped"))
    for b in buffers:
        if getattr(b, "role", None) and arch:
            # the converter renames e_score_correction_bias to e_score_correction.bias before its table
            names = parameter_gguf_names(arch, max(n_layers, 1), re.sub(r"_bias$", ".bias", b.name))
            if len(names) == 1:
                out.append(GGUFName(names[0], tuple(int(d) for d in b.shape), gguf_role(names[0]), (), "converter"))
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    scaling = next((v for v in (text.get("rope_scaling"), text.get("rope_parameters")) if isinstance(v, dict)), {})
    if arch == "llama" and (scaling.get("rope_type") or scaling.get("type")) == "llama3":
        # convert_hf_to_gguf.py's LlamaModel writes Llama 3.1's rope frequency factors, one per rotary pair
        head_dim = text.get("head_dim") or text["hidden_size"] // text["num_attention_heads"]
        out.append(GGUFName("rope_freqs.weight", (int(head_dim) // 2,), gguf_role("rope_freqs.weight"), (),
                            "converter"))
    for (module, proj), group in stacked.items():
        index = _INDEX.search(module + ".")
        name = f"blk.{int(index.group(1)) if index else 0}.{_STACKED[proj]}.weight"
        shape = (len(group), *tuple(int(d) for d in group[0].shape))
        out.append(GGUFName(name, shape, gguf_role(name), tuple(p.name for p in group), "experts"))
    # Names taken from roles can meet (an encoder's and a decoder's blk.0 in a model llama.cpp has no architecture
    # for): those keep their own names, as unmapped, so that every tensor stays one of its own.
    taken = Counter(t.name for t in out)
    # a name's role in its architecture and layer kind (a Mamba layer's attn_norm is the SSM's norm), as a file's
    kinds = block_kinds(t.name for t in out if t.mapped_by != "unmapped")
    return tuple(GGUFName(t.sources[0], t.shape, t.role, t.sources, "unmapped")
                 if t.mapped_by == "role" and taken[t.name] > 1 else
                 replace(t, role=_role_in(t.name, arch, kinds)) if t.mapped_by == "converter" else t for t in out)


def _role_in(name: str, arch: str | None, kinds: dict[int, str]) -> str:
    m = _LAYER.match(name)
    return gguf_role(name, arch, kinds.get(int(m[1])) if m else None)


def _mla_split(config: dict[str, Any]) -> tuple[int, int, int, int] | None:
    """(heads, qk_nope_head_dim, v_head_dim, kv_lora_rank) where the converter splits MLA's kv_b_proj into
    attn_k_b and attn_v_b (convert_hf_to_gguf.py's DeepseekV2Model: "MLA with the absorption optimization")."""
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    keys = ("num_attention_heads", "qk_nope_head_dim", "v_head_dim", "kv_lora_rank")
    if gguf_arch_of(config) != "deepseek2" or not all(isinstance(text.get(k), int) for k in keys):
        return None
    return tuple(text[k] for k in keys)  # type: ignore[return-value]


def _k_b_v_b(kv_b: str, source: str, split: tuple[int, int, int, int]) -> list[GGUFName]:
    """kv_b_proj [heads·(nope + v), rank] as the converter writes it: attn_k_b [heads, rank, nope] (transposed) and
    attn_v_b [heads, v, rank]; no attn_kv_b."""
    heads, nope, v, rank = split
    stem = kv_b.removesuffix("attn_kv_b.weight")
    return [GGUFName(f"{stem}attn_k_b.weight", (heads, rank, nope), gguf_role(f"{stem}attn_k_b.weight"), (source,),
                     "converter"),
            GGUFName(f"{stem}attn_v_b.weight", (heads, v, rank), gguf_role(f"{stem}attn_v_b.weight"), (source,),
                     "converter")]


@dataclass(frozen=True, slots=True)
class PredictedTensor:
    name: str  # GGUF name
    ggml_type: str  # "Q4_K", "Q6_K", "F32", ...
    shape: tuple[int, ...]  # PyTorch order (ne reversed)
    elements: int
    nbytes: int
    role: str
    sources: tuple[str, ...]  # the transformers parameter(s) it is written from
    why: str  # the rule that chose the type, in words

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "type": self.ggml_type, "shape": list(self.shape), "elements": self.elements,
                "bytes": self.nbytes, "role": self.role, "sources": list(self.sources), "why": self.why}


def _bpw(nbytes: int, elements: int) -> float | None:
    return round(nbytes * 8 / elements, 4) if elements else None


@dataclass(frozen=True)
class GGUFPrediction:
    """The tensors of the GGUF file `llama-quantize` would write for a model in a mixture."""

    mixture: str  # "Q4_K_M"
    arch: str | None  # llama.cpp's architecture name, None when the gguf package has none for the model type
    tensors: tuple[PredictedTensor, ...]
    tied_embeddings: bool
    notes: tuple[str, ...] = ()
    param_bytes: FrozenDict[str, TensorBytes] = field(default_factory=FrozenDict, compare=False)
    imatrix: bool = False

    def __post_init__(self) -> None:
        freeze_fields(self, "param_bytes")

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    @property
    def elements(self) -> int:
        return sum(t.elements for t in self.tensors)

    @property
    def bits_per_weight(self) -> float | None:
        return _bpw(self.nbytes, self.elements)

    def _grouped(self, key: str) -> dict[str, dict[str, Any]]:
        rows: dict[str, dict[str, Any]] = {}
        for t in self.tensors:
            row = rows.setdefault(getattr(t, key), {"tensors": 0, "elements": 0, "bytes": 0})
            row["tensors"] += 1
            row["elements"] += t.elements
            row["bytes"] += t.nbytes
        return {k: {**rows[k], "bits_per_weight": _bpw(rows[k]["bytes"], rows[k]["elements"])} for k in sorted(rows)}

    def by_type(self) -> dict[str, dict[str, Any]]:
        return self._grouped("ggml_type")

    def by_role(self) -> dict[str, dict[str, Any]]:
        return self._grouped("role")

    def summary(self) -> list[str]:
        """The predicted file in a few lines: the mixture and its source, the totals, the bytes by ggml type."""
        gib = self.nbytes / 2**30
        types = ", ".join(f"{kind} {row['tensors']:,} tensors {row['bytes']:,} B" for kind, row in
                          sorted(self.by_type().items(), key=lambda kv: -kv[1]["bytes"]))
        return [*self.notes,
                f"predicted {self.mixture} GGUF file: {len(self.tensors):,} tensors, {self.nbytes:,} B of tensor data "
                f"({gib:.2f} GiB), {self.bits_per_weight:.2f} bits per weight; the file adds its metadata (vocabulary, "
                "chat template: a few MB) and alignment padding", f"by ggml type: {types}"]

    def to_dict(self) -> dict[str, Any]:
        return {"mixture": self.mixture, "source": SOURCE, "imatrix": self.imatrix, "arch": self.arch,
                "tied_embeddings": self.tied_embeddings,
                "tensors": len(self.tensors), "elements": self.elements, "bytes": self.nbytes,
                "bits_per_weight": self.bits_per_weight, "by_type": self.by_type(), "by_role": self.by_role(),
                "notes": list(self.notes), "tensor_list": [t.to_dict() for t in self.tensors]}


def mixture_name(key: str) -> str | None:
    """The llama.cpp mixture a --dtype names ("q4_k_m" → "Q4_K_M"), or None."""
    name = str(key).strip().upper().replace("-", "_")
    return name if name in MIXTURES else None


def type_bytes(kind: str, elements: int) -> int:
    """Bytes of `elements` values of ggml type `kind` (lowercase: "q4_k", "f32", "f16")."""
    if kind in ("f32", "f16", "bf16"):
        return elements * (4 if kind == "f32" else 2)
    per_block, block_bytes, _ = GGUF_TYPES[kind]
    return elements // per_block * block_bytes


@dataclass
class _State:
    """quantize_state_impl's counters."""

    n_attention_wv: int = 0
    i_attention_wv: int = 0
    i_ffn_down: int = 0
    i_ffn_gate: int = 0
    i_ffn_up: int = 0


def _category(name: str) -> str:
    """tensor_get_category, by the same substring tests in the same order."""
    if name == "output.weight":
        return "output"
    if name in ("token_embd.weight", "per_layer_token_embd.weight"):
        return "token_embd"
    for part, cat in (("attn_qkv.weight", "attn_qkv"), ("attn_kv_b.weight", "attn_kv_b"), ("attn_v.weight", "attn_v"),
                      ("attn_k.weight", "attn_k"), ("attn_q.weight", "attn_q"),
                      ("attn_output.weight", "attn_output"), ("ffn_up", "ffn_up"), ("ffn_gate", "ffn_gate"),
                      ("ffn_down", "ffn_down")):
        if part in name:
            return cat
    return "other"


def _n_dims(shape: tuple[int, ...]) -> int:
    """ggml_n_dims: trailing ggml dimensions of 1 (leading ones in PyTorch's order) do not count."""
    dims = list(reversed(shape)) or [1]
    while len(dims) > 1 and dims[-1] == 1:
        dims.pop()
    return len(dims)


def _allows_quantization(t: GGUFName) -> bool:
    if _n_dims(t.shape) < 2 or not t.name.endswith("weight"):
        return False
    if t.name in ("position_embd.weight", "token_types.weight"):
        return False
    return not any(part in t.name for part in _NOT_QUANTISED)


def _converter_type(t: GGUFName) -> str:
    """The type convert_hf_to_gguf.py writes (its default --outtype f16): F32 for 1-D tensors, norms, biases and
    routers, F16 for the rest."""
    if len(t.shape) <= 1 or t.name.endswith("_norm.weight") or not t.name.endswith(".weight") or \
            any(t.name.startswith(p) or f".{p}" in t.name for p in _CONVERTER_F32):
        return "f32"
    return "f16"


def _use_more_bits(i_layer: int, n_layers: int) -> bool:
    return i_layer < n_layers // 8 or i_layer >= 7 * n_layers // 8 or (i_layer - n_layers // 8) % 3 == 2


def _layer(name: str, counter: int, n_expert: int) -> int:
    """layer_info: the counter, except with experts (n_expert > 1), where llama.cpp reads the layer off the name."""
    if n_expert > 1:
        m = _LAYER.match(name)
        return int(m.group(1)) if m else counter
    return counter


@dataclass(frozen=True)
class _Model:
    arch: str | None
    n_layer: int
    n_gqa: int
    n_expert: int
    is_70b: bool
    tied: bool
    imatrix: bool = False  # qs.has_imatrix


def _choose(qs: _State, m: _Model, ftype: str, default: str, t: GGUFName, cat: str) -> tuple[str, str]:
    """llama_tensor_get_type_impl for the mixtures offered: (type, why)."""
    new, why = default, f"{ftype}'s default type"
    nx = t.shape[-1]
    falcon = m.arch == "falcon"
    if cat == "output" or (m.tied and cat == "token_embd"):
        what = "the output tensor" if cat == "output" else "token_embd (tied embeddings: it is the output)"
        if falcon or nx % GGUF_TYPES[new][0]:
            return "q8_0", f"{what}: Q8_0 ({'Falcon' if falcon else f'its rows of {nx:,} are no whole block'})"
        if new != "q8_0":
            return "q6_k", f"{what}: Q6_K"
        return new, f"{what}: Q8_0 (already)"
    if cat == "token_embd":
        return new, f"token_embd: {ftype}'s default type"
    if cat in ("attn_v", "attn_qkv", "attn_kv_b"):
        i = qs.i_attention_wv
        if ftype == "Q2_K":
            new, why = ("q4_k", "attn_v: Q4_K (GQA ≥ 4)") if m.n_gqa >= 4 else ("q3_k", "attn_v: Q3_K")
        elif ftype in ("IQ3_S",) and m.n_gqa >= 4:
            new, why = "q4_k", "attn_v: Q4_K (GQA ≥ 4)"
        elif ftype == "IQ3_M":
            new, why = "q4_k", "attn_v: Q4_K"
        elif ftype == "Q3_K_M":
            new, why = ("q5_k", "attn_v: Q5_K (first 2)") if i < 2 else ("q4_k", "attn_v: Q4_K")
        elif ftype == "Q3_K_L":
            new, why = "q5_k", "attn_v: Q5_K"
        elif ftype in ("IQ4_NL", "IQ4_XS") and m.n_gqa >= 4:
            new, why = "q5_k", "attn_v: Q5_K (GQA ≥ 4)"
        elif ftype in ("Q4_K_M", "Q5_K_M") and _use_more_bits(i, qs.n_attention_wv):
            new, why = "q6_k", f"attn_v: Q6_K (use_more_bits({i}, {qs.n_attention_wv}))"
        elif ftype == "Q4_K_S" and i < 4:
            new, why = "q5_k", "attn_v: Q5_K (first 4)"
        if m.is_70b and new in ("q3_k", "q4_k"):
            new, why = "q5_k", "attn_v: Q5_K (a 70B model: 8 heads share each attn_v)"
        if m.n_expert == 8:
            new, why = "q8_0", "attn_v: Q8_0 (8 experts)"
        qs.i_attention_wv += 1
        return new, why
    if cat == "attn_k":
        if m.n_expert == 8:
            return "q8_0", "attn_k: Q8_0 (8 experts)"
        return new, why
    if cat == "ffn_down":
        i, n = _layer(t.name, qs.i_ffn_down, m.n_expert), m.n_layer
        if ftype == "Q2_K":
            new, why = "q3_k", "ffn_down: Q3_K"
        elif ftype == "Q3_K_M":
            if i < n // 16:
                new, why = "q5_k", f"ffn_down: Q5_K (layer {i} < {n}/16)"
            elif not falcon or _use_more_bits(i, n):
                new, why = "q4_k", "ffn_down: Q4_K"
            else:
                new, why = "q3_k", "ffn_down: Q3_K"
        elif ftype == "IQ3_M" and (i < n // 8 or (m.n_expert == 8 and _use_more_bits(i, n))):
            new, why = "q4_k", f"ffn_down: Q4_K (layer {i} of {n})"
        elif ftype == "Q3_K_L":
            new, why = ("q4_k", "ffn_down: Q4_K (Falcon)") if falcon else ("q5_k", "ffn_down: Q5_K")
        elif ftype == "Q4_K_M":
            if falcon:
                new = "q6_k" if i < n // 16 else "q5_k" if _use_more_bits(i, n) else "q4_k"
                why = f"ffn_down: {new.upper()} (Falcon, layer {i} of {n})"
            elif _use_more_bits(i, n):
                new, why = "q6_k", f"ffn_down: Q6_K (use_more_bits({i}, {n}))"
        elif i < n // 8 and ftype in ("IQ4_NL", "IQ4_XS") and not m.imatrix:
            new, why = "q5_k", f"ffn_down: Q5_K (layer {i} < {n}/8, no importance matrix)"
        elif ftype == "Q5_K_M" and _use_more_bits(i, n):
            new, why = "q6_k", f"ffn_down: Q6_K (use_more_bits({i}, {n}))"
        elif ftype == "Q4_K_S" and not falcon and i < n // 8:
            new, why = "q5_k", f"ffn_down: Q5_K (layer {i} < {n}/8)"
        elif ftype in ("Q4_0", "Q5_0") and m.imatrix and i < n // 8:
            new = "q4_1" if ftype == "Q4_0" else "q5_1"
            why = f"ffn_down: {new.upper()} (layer {i} < {n}/8, with an importance matrix)"
        qs.i_ffn_down += 1
        return new, why
    if cat == "attn_output":
        if not falcon:
            if m.n_expert == 8:
                if ftype in ("Q2_K", "Q3_K_S", "Q3_K_M", "IQ4_NL", "Q4_K_S", "Q4_K_M", "IQ3_S", "IQ3_M", "IQ4_XS"):
                    return "q5_k", "attn_output: Q5_K (8 experts)"
            elif ftype == "Q2_K":
                return "q3_k", "attn_output: Q3_K"
            elif ftype in ("Q3_K_M", "IQ3_M"):
                return "q4_k", "attn_output: Q4_K"
            elif ftype == "Q3_K_L":
                return "q5_k", "attn_output: Q5_K"
        elif ftype == "Q3_K_L":
            return "q4_k", "attn_output: Q4_K (Falcon)"
        return new, why
    if cat == "attn_qkv":  # unreachable: attn_qkv is taken with attn_v above, as in llama.cpp
        return new, why
    if cat == "ffn_gate":
        qs.i_ffn_gate += 1
    elif cat == "ffn_up":
        qs.i_ffn_up += 1
    return new, why


def _fallback(kind: str, nx: int, name: str, ftype: str) -> tuple[str, str]:
    """tensor_type_fallback: (type, words) for `name`'s rows of `nx` values. Only the K and IQ types (blocks of 256)
    have a fallback; for any other (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL: blocks of 32) llama-quantize throws "no
    tensor type fallback is defined for type ..." and writes no file, so the prediction is refused with the tensor
    and a mixture that does fall back."""
    per_block = GGUF_TYPES[kind][0]
    if nx % per_block == 0:
        return kind, ""
    if kind not in _FALLBACK:
        raise UnsupportedError(
            f"llama-quantize {ftype} writes no file for this model: {name}'s rows of {nx:,} values are no whole "
            f"number of {kind.upper()} blocks of {per_block}, and its tensor_type_fallback (src/llama-quant.cpp at "
            f"{LLAMA_CPP_COMMIT[:12]}) throws \"no tensor type fallback is defined for type {kind}\"; a K mixture "
            "({0} q4_k_m, q5_k_m, q6_k, ...) falls back per tensor, and convert_hf_to_gguf.py's q8_0 outtype keeps "
            "such a tensor unquantised", "dtype")
    back = _FALLBACK[kind]
    if nx % GGUF_TYPES[back][0]:
        return "f16", f"; rows of {nx:,} fit no {kind.upper()} or {back.upper()} block: F16"
    return back, f"; rows of {nx:,} are no multiple of {per_block}: {back.upper()} (llama.cpp's fallback)"


def _model(config: dict[str, Any], n_layers: int, tied: bool, imatrix: bool = False) -> _Model:
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    n_head = int(text.get("num_attention_heads") or text.get("n_head") or 1)
    n_kv = int(text.get("num_key_value_heads") or n_head)
    n_expert = 0
    for key in ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts"):
        if isinstance(text.get(key), int):
            n_expert = text[key]
            break
    arch = gguf_arch_of(config)
    n_layer = int(text.get("num_hidden_layers") or n_layers or 1)
    # llama-model.cpp's LLM_TYPE_70B: 80 layers for qwen2, deci and olmoe, and for llama with grouped KV heads (80
    # layers without them are its 65B)
    is_70b = n_layer == 80 and (arch in ("qwen2", "deci", "olmoe") or (arch == "llama" and n_head != n_kv))
    return _Model(arch, n_layer, max(n_head // max(n_kv, 1), 1), n_expert, is_70b, tied, imatrix)


def predict_gguf(params: Iterable[Any], config: dict[str, Any], mixture: str, *, n_layers: int = 0,
                 transposed: frozenset[str] = frozenset(), buffers: Iterable[Any] = (),
                 imatrix: bool = False) -> GGUFPrediction:
    """The GGUF file `llama-quantize` writes for the model of `params` (ParameterInfo: name, shape, role, aliases)
    in `mixture` ("Q4_K_M"): every tensor's ggml type and exact bytes, and each parameter's bytes. `imatrix`:
    quantised with an importance matrix (llama-quantize --imatrix), which a few rules read.

    A tied output head (transformers' lm_head.weight is embed_tokens.weight) is one parameter, so the file holds no
    output.weight, as the converter writes it; llama.cpp then types token_embd as the output tensor."""
    params = tuple(params)
    config = config_fields(config)
    ftype = mixture_name(mixture)
    if ftype is None:
        raise ValueError(f"no llama.cpp mixture {mixture!r}")
    default = MIXTURES[ftype]
    names = converter_tensors(params, config, n_layers, transposed, buffers)
    tied = not any(t.name == "output.weight" for t in names)
    model = _model(config, n_layers, tied, imatrix)
    qs = _State(n_attention_wv=sum(_category(t.name) in ("attn_v", "attn_qkv", "attn_kv_b") for t in names))
    order = sorted(names, key=lambda t: (int(m.group(1)) if (m := _LAYER.match(t.name)) else -1, t.name))
    predicted: list[PredictedTensor] = []
    for t in order:
        if not _allows_quantization(t):
            kind = _converter_type(t)
            why = "kept as converted: " + ("F32 (1-D, norm, bias or router)" if kind == "f32" else "F16")
        else:
            kind, why = _choose(qs, model, ftype, default, t, _category(t.name))
            kind, more = _fallback(kind, t.shape[-1], t.name, ftype)
            why += more
        predicted.append(PredictedTensor(t.name, kind.upper(), t.shape, t.elements, type_bytes(kind, t.elements),
                                         t.role, t.sources, why))
    numel = {p.name: p.numel for p in params}
    # Each parameter's bytes: the tensors written from it (two for a fused gate_up of experts), or its slice of a
    # stacked tensor (one expert of E: the rows are quantised independently, so the bytes divide exactly).
    shares: dict[str, list[tuple[str, str, int]]] = {}
    for t in predicted:
        for source in t.sources:
            part = t.nbytes if len(t.sources) == 1 else type_bytes(t.ggml_type.lower(), numel[source])
            shares.setdefault(source, []).append((t.name, t.ggml_type, part))
    param_bytes: dict[str, TensorBytes] = {}
    for name, rows in shares.items():
        kinds = sorted({_STORAGE.get(kind, kind.lower()) for _, kind, _ in rows})
        param_bytes[name] = TensorBytes(sum(b for *_, b in rows), 0, "+".join(kinds),
                                        " + ".join(f"{gname} {kind} {b:,} B" for gname, kind, b in rows))
    with_imatrix = "with an importance matrix (--imatrix)" if imatrix else \
        "without an importance matrix (--imatrix: with one, as most published GGUFs are made)"
    notes = [f"{ftype}: each tensor's type as {SOURCE} picks it, {with_imatrix}"]
    counts = Counter((t.role, t.ggml_type) for t in predicted if t.ggml_type not in ("F32", "F16"))
    promoted = sorted({f"{role} {kind}" for (role, kind) in counts if kind.lower() != default})
    if promoted:
        notes.append(f"typed other than {default.upper()} (promoted, or a row that fits no {default.upper()} "
                     "block falling back): " + ", ".join(promoted))
    if tied:
        notes.append("tied embeddings: the file holds token_embd only, typed as the output tensor")
    if model.arch is None:
        text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
        notes.append(f"llama.cpp has no architecture for model_type {str(text.get('model_type') or '?')!r} (the gguf "
                     "package names none): convert_hf_to_gguf.py would not convert it; its tensors are named by their "
                     "roles and typed by llama.cpp's rules as if it did")
    unmapped = [t.sources[0] for t in names if t.mapped_by == "unmapped"]
    if unmapped:
        notes.append(f"{len(unmapped)} parameter(s) with no GGUF name (typed by llama.cpp's rules as 'other'), "
                     f"e.g. {unmapped[0]}")
    if any(t.name.endswith("attn_k_b.weight") for t in predicted):
        notes.append("MLA: kv_b_proj is written as attn_k_b and attn_v_b, as the converter splits it (llama.cpp's "
                     "rules know neither name: default type)")
    extra = [t for t in predicted if not t.sources]
    if extra:
        shown = ", ".join(f"{t.name} ({t.nbytes:,} B {t.ggml_type})" for t in extra[:3])
        more = f" and {len(extra) - 3:,} more" if len(extra) > 3 else ""
        notes.append(f"the file also holds {shown}{more}, {sum(t.nbytes for t in extra):,} B in all: written by the "
                     "converter from no parameter of the class (the rope frequency factors, a learned buffer), so "
                     "not in the weights above")
    if any(len(t.sources) > 1 for t in names):
        notes.append("per-expert linears are stacked into one tensor per layer and projection, as the converter "
                     "writes them")
    return GGUFPrediction(ftype, model.arch, tuple(predicted), tied, tuple(notes), param_bytes, imatrix)


@dataclass(frozen=True)
class MixtureFormat(WeightFormat):
    """A llama.cpp mixture with its predicted file: weights.weight_memory takes each parameter's bytes from it
    (`stored_bytes`, `quantized_names`: the hooks a format that types each tensor on its own answers)."""

    prediction: GGUFPrediction | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        parts: dict[str, list[PredictedTensor]] = {}
        for t in self.prediction.tensors if self.prediction else ():
            for source in t.sources:
                parts.setdefault(source, []).append(t)
        object.__setattr__(self, "_parts", parts)  # looked up per parameter

    def stored_bytes(self, param: Any) -> TensorBytes:
        """The parameter's bytes in the predicted file; a tensor-parallel rank's slice (parallel/serving.py) holds
        its share of each of its tensors, in whole blocks of the tensor's type."""
        given = self.prediction.param_bytes.get(param.name) if self.prediction else None
        if given is None:
            return self.plain_bytes(param.numel, "float32")
        tensors = self._parts[param.name]
        whole = sum(t.elements // len(t.sources) for t in tensors)
        if param.numel == whole:
            return given
        total, parts = 0, []
        for t in tensors:
            kind = t.ggml_type.lower()
            block = GGUF_TYPES[kind][0] if kind in GGUF_TYPES else 1
            share, rest = divmod(t.elements // len(t.sources) * param.numel, whole)
            last = param.shape[-1] if param.shape else 1
            if rest or share % block or (len(param.shape) > 1 and last % block):
                raise UnsupportedError(f"{param.name}: a slice of {param.numel:,} of its {whole:,} values is no "
                                       f"whole number of {t.ggml_type} blocks of {block}; give {{0}} to price the "
                                       "slices in one type", "dtype")
            part = type_bytes(kind, share)
            total += part
            parts.append(f"{t.ggml_type} {share:,} values {part:,} B")
        return TensorBytes(total, 0, given.storage, " + ".join(parts))

    def quantized_names(self, params: Iterable[Any]) -> frozenset[str]:
        costs = self.prediction.param_bytes if self.prediction else {}
        return frozenset(p.name for p in params if p.name in costs
                         and not set(costs[p.name].storage.split("+")) <= {"fp32", "fp16"})


def with_prediction(fmt: WeightFormat, params: Iterable[Any], config: dict[str, Any], n_layers: int,
                    transposed: frozenset[str] = frozenset(), buffers: Iterable[Any] = (), *,
                    imatrix: bool = False) -> MixtureFormat:
    """`fmt` (a mixture --dtype) with the file llama-quantize would write for these parameters."""
    values = {f.name: getattr(fmt, f.name) for f in fmt.__dataclass_fields__.values() if f.init}
    prediction = predict_gguf(params, config, fmt.mixture or "", n_layers=n_layers, transposed=transposed,
                              buffers=buffers, imatrix=imatrix)
    return MixtureFormat(**values, prediction=prediction)
