"""What llama.cpp reads of a model and where it places each layer (llama_cpp.py's plan takes both): the hparams its
KV cache, recurrent states and compute buffer are sized from (`model_facts` → `LlamaCppModel`, a config converted as
convert_hf_to_gguf.py writes it), and load_tensors' placement of layers on GPUs and the CPU (`placement`). The
llama.cpp sources each follows are `SOURCES`; llama_cpp.py's docstring says what each does."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...errors import UnsupportedError
from ..dims import config_int, decoder_layers, dim, is_mla, max_context, text_config
from .kv import attention_shape, layer_kinds

SOURCES = {
    "load_tensors": "src/llama-model.cpp load_tensors and llama_model::n_gpu_layers() of the llama.cpp in "
                    "llama-cpp-python 0.3.36 (the build whose KV and compute buffers were checked)",
    "context": "src/llama-context.cpp at 02c28f533ebb",
    "kv": "src/llama-kv-cache.cpp and src/llama-kv-cache-iswa.cpp at 02c28f533ebb",
    "recurrent": "src/llama-hparams.cpp n_embd_r/n_embd_s at 01b77b579398 and 8b1d44b90c2a",
    "mla": "src/llama-kv-cache.cpp's llama_kv_cache constructor, has_v = !is_mla (current master; ggml-org "
           "3514e9f6 still allocated a V of kv_lora_rank values), and convert_hf_to_gguf.py's DeepseekV2Model "
           "(key_length kv_lora_rank + qk_rope_head_dim, value_length kv_lora_rank, one KV head)",
    "n_cpu_moe": "common/common.h LLM_FFN_EXPS_REGEX",
    "hybrids": "src/llama-model.cpp load_hparams (granitehybrid: recurrent_layer_arr[i] = n_head_kv(i) == 0; "
               "nemotron_h: and n_ff(i) == 0) and create_memory's layer filters, convert_hf_to_gguf.py's "
               "GraniteHybridModel and NemotronHModel (ssm.inner_size, ssm.group_count, ssm.state_size)",
    "tensor_split": "src/llama-model.cpp load_tensors: the split points and get_layer_buft_list's upper_bound",
}


@dataclass(frozen=True)
class LayerState:
    """What one layer keeps between tokens, as llama.cpp sizes it."""

    kind: str  # "full" | "swa" | "recurrent" | "none"
    k_width: int = 0  # n_embd_k_gqa: K values per cell
    v_width: int = 0  # n_embd_v_gqa
    conv: int = 0  # recurrent: n_embd_r, values per sequence
    ssm: int = 0  # recurrent: n_embd_s


@dataclass(frozen=True)
class LlamaCppModel:
    """The hparams llama.cpp's memory reads, from the model's config (a GGUF's own metadata, converted)."""

    n_layer: int
    n_embd: int
    n_head: int
    n_vocab: int
    n_ctx_train: int | None
    n_swa: int
    n_ff: int  # the largest FFN intermediate a token computes (dense n_ff, or experts used × n_ff_exp)
    layers: tuple[LayerState, ...]
    how: str  # where the shapes came from, in words


def model_facts(config: Any) -> LlamaCppModel:
    """llama.cpp's hparams for the KV cache and compute buffer, from a transformers config object. Layers slide
    where the config's `layer_types` says "sliding_attention" (as llama.cpp's SWA patterns for Gemma-2/3, Cohere2,
    gpt-oss place them); a `sliding_window` without `layer_types` (Mistral-7B-v0.1) is full attention, as llama.cpp's
    llama architecture runs it. MLA (deepseek2) caches the latent as K and no V; hybrid families keep their
    attention layers in a KV cache and their recurrent layers' states per sequence (llama_memory_hybrid)."""
    text = text_config(config)
    model_type = str(getattr(text, "model_type", ""))
    n_layer = decoder_layers(text)
    n_embd = dim(text, "hidden") or 0
    heads = dim(text, "heads") or 1
    if is_mla(text):
        # convert_hf_to_gguf.py's DeepseekV2Model writes key_length = kv_lora_rank + qk_rope_head_dim, value_length
        # = kv_lora_rank and one KV head; current llama-kv-cache.cpp allocates no V for MLA (has_v = !is_mla: V is
        # a view of K's first kv_lora_rank values)
        rank, rope = config_int(text, "kv_lora_rank") or 0, config_int(text, "qk_rope_head_dim") or 0
        k_dim, v_dim, kv_heads = rank + rope, 0, 1
        how = (f"MLA (llama.cpp's deepseek2): K = the latent kv_lora_rank {rank:,} + qk_rope_head_dim {rope:,} "
               f"= {rank + rope:,} values a cell, V a view of K (no V cache)")
    else:
        kv_heads, k_dim, v_dim, how = attention_shape(text)
    types = getattr(text, "layer_types", None)
    explicit = isinstance(types, (list, tuple)) and len(types) == n_layer
    kinds = layer_kinds(text) if explicit else [("full_attention", None)] * n_layer
    if is_mla(text) and any(kind != "full_attention" for kind, _ in kinds):
        raise UnsupportedError("{0} llama.cpp: {model_type}'s MLA beside other layer kinds ({kinds}) is not "
                               "modelled yet", "engine", model_type=model_type,
                               kinds=", ".join(sorted({kind for kind, _ in kinds})))
    if model_type == "rwkv":
        raise UnsupportedError("{0} llama.cpp: {model_type} is RWKV-4 (transformers' only RWKV class); llama.cpp "
                               "runs RWKV-6 and RWKV-7 (rwkv6, rwkv6qwen2, rwkv7, arwkv7) and no RWKV-4", "engine",
                               model_type=model_type)
    recurrent = _recurrent(text, model_type)
    if recurrent is None and not explicit and any(
            getattr(text, key, None) is not None for key in ("state_size", "ssm_state_size", "mamba_d_state",
                                                              "attention_hidden_size", "linear_num_key_heads")):
        raise UnsupportedError("{0} llama.cpp: {model_type}'s recurrent state is not modelled yet", "engine",
                               model_type=model_type)
    n_swa = 0
    layers = []
    for kind, window in kinds:
        if recurrent is not None and (model_type in _ALL_RECURRENT or kind in _RECURRENT_KINDS):
            layers.append(LayerState("recurrent", conv=recurrent[0], ssm=recurrent[1]))
        elif recurrent is not None and kind == "hybrid":  # Falcon-H1: attention and SSM side by side in each layer
            layers.append(LayerState("hybrid", kv_heads * k_dim, kv_heads * v_dim, recurrent[0], recurrent[1]))
        elif kind in ("full_attention", "sliding_attention"):
            slide = kind == "sliding_attention" and window is not None
            n_swa = max(n_swa, window or 0) if slide else n_swa
            layers.append(LayerState("swa" if slide else "full", kv_heads * k_dim, kv_heads * v_dim))
        elif kind == "none":
            layers.append(LayerState("none"))
        else:
            raise UnsupportedError("{0} llama.cpp: {model_type}'s {kind} layers are not modelled yet", "engine",
                                   model_type=model_type, kind=kind)
    experts_used = config_int(text, "num_experts_per_tok", "moe_topk", "num_experts_per_token") or 0
    if model_type == "nemotron_h" and "moe" not in [str(t) for t in types or ()]:
        experts_used = 0  # NemotronHConfig carries MoE defaults; only its "moe" layers route tokens to experts
    n_ff_exp = config_int(text, "moe_intermediate_size", "expert_intermediate_size") or 0
    n_ff = max(config_int(text, "intermediate_size", "ffn_dim", "n_inner") or 4 * n_embd,
               experts_used * (n_ff_exp or config_int(text, "intermediate_size") or 0))
    if recurrent is not None:
        how += f"; recurrent layers: {recurrent[2]}"
    if model_type in ("granitemoehybrid", "bamba", "nemotron_h"):
        how += f"; which layers keep what, and d_inner: {SOURCES['hybrids']}"
    n_ctx_train = max_context(text)
    if model_type == "granitemoehybrid" and any(layer.kind == "recurrent" for layer in layers):
        # convert_hf_to_gguf.py's GraniteHybridModel: a hybrid that is not Bamba runs without RoPE, and the converter
        # writes context_length 2**20 for it: llama.cpp's -c 0 takes that
        n_ctx_train = 1 << 20
        how += "; training context 1,048,576 (2**20, as convert_hf_to_gguf.py writes it for a Granite-4 hybrid)"
    return LlamaCppModel(n_layer, n_embd, heads, config_int(text, "vocab_size") or 0, n_ctx_train, n_swa,
                         n_ff, tuple(layers), how)


_ALL_RECURRENT = ("mamba", "mamba2", "falcon_mamba")
# the config's layer_types for a recurrent layer: Jamba's Mamba ("linear_attention" in transformers' layer_types,
# "mamba" in layers_block_type), Qwen3-Next's gated delta net, LFM2's short convolution
_RECURRENT_KINDS = ("mamba", "linear_attention", "conv")


def _recurrent(text: Any, model_type: str) -> tuple[int, int, str] | None:
    """(n_embd_r, n_embd_s, in words) of a recurrent layer, as llama-hparams.cpp sizes them from the hparams
    convert_hf_to_gguf.py writes: n_embd_r = (d_conv − 1) × (d_inner + 2 × n_group × d_state), or n_embd ×
    (L_cache − 1) for LFM2's short convolution; n_embd_s = d_state × d_inner. None for other families."""
    hidden = dim(text, "hidden") or 0
    if model_type in ("mamba", "falcon_mamba"):
        inner = config_int(text, "intermediate_size") or 0
        conv, state, groups = config_int(text, "conv_kernel") or 4, config_int(text, "state_size") or 16, 0
        name = "Mamba"
    elif model_type == "mamba2":
        inner = (config_int(text, "num_heads") or 0) * (config_int(text, "head_dim") or 0)
        conv, state = config_int(text, "conv_kernel") or 4, config_int(text, "state_size") or 128
        groups, name = config_int(text, "n_groups") or 1, "Mamba-2"
    elif model_type == "jamba":  # Mamba-1 layers: d_inner = mamba_expand × hidden, no groups
        inner = (config_int(text, "mamba_expand") or 2) * hidden
        conv, state, groups = config_int(text, "mamba_d_conv") or 4, config_int(text, "mamba_d_state") or 16, 0
        name = "Jamba's Mamba"
    elif model_type == "falcon_h1":  # Mamba-2 beside attention in every layer; ssm.inner_size = mamba_d_ssm
        inner = config_int(text, "mamba_d_ssm") or (config_int(text, "mamba_expand") or 2) * hidden
        conv, state = config_int(text, "mamba_d_conv") or 4, config_int(text, "mamba_d_state") or 256
        groups, name = config_int(text, "mamba_n_groups") or 1, "Falcon-H1's Mamba-2 (beside attention)"
    elif model_type == "qwen3_next":  # gated delta net: d_state = key head dim, n_group = key heads,
        # d_inner = value heads × value head dim (convert_hf_to_gguf.py's Qwen3NextModel)
        inner = (config_int(text, "linear_num_value_heads") or 0) * (config_int(text, "linear_value_head_dim") or 0)
        conv, state = config_int(text, "linear_conv_kernel_dim") or 4, config_int(text, "linear_key_head_dim") or 0
        groups, name = config_int(text, "linear_num_key_heads") or 0, "Qwen3-Next's gated delta net"
    elif model_type in ("lfm2", "lfm2_moe"):  # short convolution: n_embd × (L_cache − 1) conv values, no SSM
        # state (llama-hparams.cpp sizes it from shortconv.l_cache alone, LFM2-MoE's layers as LFM2's)
        return hidden * ((config_int(text, "conv_L_cache") or 3) - 1), 0, "LFM2's short convolution"
    elif model_type in ("granitemoehybrid", "bamba"):
        # convert_hf_to_gguf.py's GraniteHybridModel (GraniteMoeHybridForCausalLM and BambaForCausalLM, llama.cpp's
        # granitehybrid): d_inner = mamba_expand × d_model, d_model being hidden_size (its first key,
        # "mamba_head_dim", is no field of these configs); n_group mamba_n_groups, d_state mamba_d_state
        inner = (config_int(text, "mamba_expand") or 2) * hidden
        conv, state = config_int(text, "mamba_d_conv") or 4, config_int(text, "mamba_d_state") or 0
        groups = config_int(text, "mamba_n_groups") or 1
        name = ("Bamba's" if model_type == "bamba" else "Granite-4's") + " Mamba-2 (llama.cpp's granitehybrid)"
    elif model_type == "nemotron_h":
        # convert_hf_to_gguf.py's NemotronHModel: d_inner = mamba_num_heads × mamba_head_dim ("don't use expand"),
        # n_group n_groups, d_state ssm_state_size, d_conv conv_kernel
        inner = (config_int(text, "mamba_num_heads") or 0) * (config_int(text, "mamba_head_dim") or 0)
        conv, state = config_int(text, "conv_kernel") or 4, config_int(text, "ssm_state_size") or 0
        groups, name = config_int(text, "n_groups") or 1, "Nemotron-H's Mamba-2"
    else:
        return None
    return (conv - 1) * (inner + 2 * groups * state), state * inner, name


@dataclass(frozen=True)
class Placement:
    """Which device holds each part: `layer_devices[il]` the GPU index of layer il (il = n_layer: the output layer),
    None for the CPU; the experts of layers below cpu_moe on the CPU."""

    n_gpu_layers: int  # as given to llama.cpp (-1 resolved to n_layer + 1)
    first_gpu_layer: int
    output_on_gpu: bool
    cpu_moe: int
    layer_devices: tuple[int | None, ...]  # n_layer + 1 entries, the last the output layer's
    splits: tuple[float, ...] = (1.0,)  # the cumulative fractions llama.cpp compares against, one a GPU
    tensor_split: tuple[float, ...] | None = None  # --tensor-split as given (None: by free memory)

    @property
    def gpus(self) -> int:
        return len(self.splits)

    def layer_device(self, il: int) -> int | None:
        return self.layer_devices[il]

    @property
    def output_device(self) -> int | None:
        return self.layer_devices[-1]

    def layers_on(self, gpu: int, n_layer: int) -> list[int]:
        return [il for il in range(n_layer) if self.layer_device(il) == gpu]


def split_points(tensor_split: tuple[float, ...] | None, gpus: int) -> tuple[float, ...]:
    """load_tensors' split points in float32, as llama.cpp computes them: --tensor-split's values (missing ones 0;
    all zero or none given: each device's free memory, here taken as equal), summed cumulatively and divided by the
    sum."""
    import numpy as np

    given = [float(v) for v in (tensor_split or ())] + [0.0] * gpus
    values = [np.float32(v) for v in given[:gpus]]
    if not any(values):
        values = [np.float32(1.0)] * gpus
    total = np.float32(0.0)
    cumulative = []
    for v in values:
        total = np.float32(total + v)
        cumulative.append(total)
    return tuple(float(np.float32(c / total)) for c in cumulative)


def placement(n_layer: int, n_gpu_layers: int, cpu_moe: int, tensor_split: tuple[float, ...] | None = None,
              gpus: int = 1) -> Placement:
    """llama-model.cpp's get_layer_buft_list, as current llama.cpp has it: N = n_gpu_layers (negative: n_layer + 1,
    llama_model::n_gpu_layers()), i_gpu_start = max(n_layer + 1 − N, 0), act_gpu_layers = min(N, n_layer + 1);
    layer il (il = n_layer: the output layer) on a GPU when i_gpu_start ≤ il and il − i_gpu_start < act_gpu_layers,
    the output layer first to go: -ngl N holds it and the last N − 1 repeating layers. With several GPUs (split mode
    layer, llama.cpp's default) the GPU is std::upper_bound(splits, float(il − i_gpu_start) / act_gpu_layers): the
    first whose cumulative fraction exceeds the layer's, in float32."""
    import numpy as np

    ngl = n_layer + 1 if n_gpu_layers < 0 else n_gpu_layers
    start = max(n_layer + 1 - ngl, 0)
    act = min(ngl, n_layer + 1)
    splits = split_points(tensor_split, gpus)
    devices: list[int | None] = []
    for il in range(n_layer + 1):
        if il < start or il - start >= act:
            devices.append(None)
            continue
        at = np.float32(np.float32(il - start) / np.float32(act))
        devices.append(next((g for g, point in enumerate(splits) if np.float32(point) > at), len(splits) - 1))
    first = next((il for il in range(n_layer) if devices[il] is not None), n_layer + 1)
    return Placement(ngl, first, devices[n_layer] is not None, min(cpu_moe, n_layer), tuple(devices), splits,
                     tuple(tensor_split) if tensor_split else None)
