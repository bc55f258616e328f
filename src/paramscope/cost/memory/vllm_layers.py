"""A model's layers as vLLM reads them: each layer's KV cache specs (full, sliding or chunked attention, MLA, a
Mamba state, an encoder-decoder's cross-attention), the encoder-decoders vLLM's V1 engine serves, a recurrent
layer's state in vLLM's shapes, and the pipeline stages' layers (get_pp_indices). vllm.py's docstring gives the
rules and their sources.
"""

from __future__ import annotations

from typing import Any

from ...errors import OptionError, UnsupportedError

def vllm_layer_kinds(config: Any, kv_dtype: str, tp: int, compute_dtype: str = "bfloat16") -> tuple[
        list[tuple[str, int | None, int]], int, str, list[str], tuple[int, str] | None]:
    """([(kind, window, layers)] in vLLM's reading, bytes per token of one attention layer (a rank's; 0 without
    attention), its arithmetic, notes, and a Mamba layer's state (bytes a sequence, arithmetic) or None).

    The bytes per token come from memory/kv.py at `tp` ("latent" for MLA, "grouped" otherwise: K and V once per
    key/value head, as vLLM's paged cache keeps them); a recurrent layer's state is vLLM's own shapes
    (`vllm_mamba_state`), which differ from transformers' cache."""
    from ..dims import is_mla, text_config
    from .kv import kv_cache

    text = text_config(config)
    encoder = encoder_shape(text)
    mla = is_mla(text)
    cache = kv_cache(config, batch=1, seq=1, dtype=kv_dtype, layout="latent" if mla else "grouped", tp=tp,
                     encoder_seq=encoder[0] if encoder else None)
    attention = [g for g in cache.groups if g.per_token and g.kind != "cross-attention"]
    per_layer = attention[0].per_token // attention[0].layers if attention else 0
    arithmetic = attention[0].arithmetic if attention else ""
    cross = [g for g in cache.groups if g.kind == "cross-attention" and g.fixed]
    if cross and cross[0].fixed != cross[0].layers * cross[0].tokens * per_layer:
        raise UnsupportedError("{model_type}'s cross-attention page differs from its self-attention page: vLLM "
                               "cannot unify them", model_type=getattr(text, "model_type", "this model"))
    per_layer_keys, slid_by_default = vllm_layer_keys(config)
    counts: dict[tuple[str, int | None], int] = {}
    notes = []
    for keys in per_layer_keys:
        for key in keys:
            counts[key] = counts.get(key, 0) + 1
    mamba = None
    if ("mamba state", None) in counts:
        mamba = vllm_mamba_state(text, compute_dtype, tp)
        if mamba is None:
            raise UnsupportedError("{model_type}'s recurrent layers: {0} vllm knows vLLM's state shapes for "
                                   "Mamba (Jamba), Mamba-2 (Bamba, Granite-4.0-H, Nemotron-H, Falcon-H1, Zamba2) "
                                   "and gated delta nets (Qwen3-Next), not this one", "engine",
                                   model_type=getattr(text, "model_type", "this model"))
    if not per_layer and mamba is None:
        raise UnsupportedError("no attention layer holds a KV cache here: vLLM's paged KV pre-flight has nothing to "
                               "allocate")
    if slid_by_default:
        notes.append("the config sets a sliding_window but no layer_types: vLLM's model classes (llama.py and "
                     "those built like it) give a layer a window only where layer_types says so, so every layer "
                     "is full attention here (transformers' cache slides them)")
    return ([(kind, window, layers) for (kind, window), layers in counts.items()], per_layer, arithmetic, notes,
            mamba)


_RECURRENT = ("linear_attention", "conv", "mamba", "mamba2", "ssm", "recurrent", "attention_free")
# the encoder-decoders vLLM's V1 engine serves (model_executor/models/registry.py): Whisper alone; BART, T5, mBART,
# Florence-2 and the rest went with the V0 engine
_VLLM_ENCODER_DECODERS = ("whisper",)


def encoder_shape(text: Any) -> tuple[int, str] | None:
    """(the encoder length every request's cross-attention holds, where from) for an encoder-decoder vLLM serves;
    None for a decoder-only model; UnsupportedError for an encoder-decoder vLLM V1 does not serve."""
    from ..dims import config_int

    if not getattr(text, "is_encoder_decoder", False):
        return None
    model_type = str(getattr(text, "model_type", "") or "")
    if model_type not in _VLLM_ENCODER_DECODERS:
        raise UnsupportedError("{model_type} is an encoder-decoder vLLM's V1 engine does not serve (it serves Whisper; "
                               "BART, T5 and the other encoder-decoders went with the V0 engine)",
                               model_type=model_type or "this model")
    length = config_int(text, "max_source_positions")
    if not length:
        raise UnsupportedError("{model_type}'s config gives no max_source_positions: the encoder length vLLM's "
                               "cross-attention cache holds", model_type=model_type)
    return length, ("max_source_positions (vLLM's max_num_encoder_input_tokens for an encoder-decoder: "
                    "MULTIMODAL_REGISTRY.get_encdec_max_encoder_len, Whisper's audio padded to 30 s)")


def refuse_unserved_encoder_decoder(config: Any) -> None:
    """Before any build, from the config file's own fields: one line for an encoder-decoder that vLLM's V1 engine
    does not serve (a config that does not declare is_encoder_decoder is caught after the build)."""
    from types import SimpleNamespace

    if isinstance(config, dict) and config.get("is_encoder_decoder") is True:
        encoder_shape(SimpleNamespace(is_encoder_decoder=True, model_type=str(config.get("model_type", "")),
                                      max_source_positions=config.get("max_source_positions")))


def vllm_layer_keys(config: Any) -> tuple[list[list[tuple[str, int | None]]], bool]:
    """(each decoder layer's KV cache specs in vLLM's reading, in layer order, as (kind, window) keys; whether a
    config's sliding window goes unused because it gives no layer_types). A cross-attention key's second item is
    the encoder length."""
    from ..dims import is_mla, text_config
    from .kv import layer_kinds

    text = text_config(config)
    encoder = encoder_shape(text)
    mla = is_mla(text)
    has_types = isinstance(getattr(text, "layer_types", None), (list, tuple)) and bool(text.layer_types)
    out: list[list[tuple[str, int | None]]] = []
    slid_by_default = False
    for kind, window in layer_kinds(text):
        keys: list[tuple[str, int | None]] = []
        if kind in ("shared", "none"):
            out.append(keys)
            continue
        if kind in _RECURRENT:
            keys.append(("mamba state", None))
        elif kind in ("sliding_attention", "hybrid_sliding") and window and has_types:
            keys.append((f"sliding window {window:,}", window))
        elif kind == "chunked_attention" and window:
            keys.append((f"chunked {window:,}", window))
        else:
            slid_by_default |= kind in ("sliding_attention", "hybrid_sliding") and bool(window)
            keys.append(("MLA latent" if mla else "full attention", None))
        if kind in ("hybrid", "hybrid_sliding"):  # attention and a Mamba mixer in one layer (Falcon-H1): two specs
            keys.append(("mamba state", None))
        if encoder is not None:  # a decoder layer's cross-attention: a CrossAttentionSpec beside its self-attention
            keys.append(("cross-attention", encoder[0]))
        out.append(keys)
    return out, slid_by_default


def vllm_pp_partition(layers: int, pp: int, partition: tuple[int, ...] | None = None) -> tuple[int, ...]:
    """Each pipeline stage's layer count as vLLM's get_pp_indices (distributed/utils.py) gives it: layers // pp
    each, the remainder one a stage to the stages before the last, from the one before the last backwards (the
    last holds the final norm and head); VLLM_PP_LAYER_PARTITION (`partition`) replaces the rule, and must give
    pp counts summing to the layers."""
    if pp > layers:
        raise OptionError("{0} {pp} is more than the model's {layers} layers: each stage holds one or more", "pp",
                          pp=pp, layers=layers)
    if partition is not None:
        if len(partition) != pp or sum(partition) != layers:
            raise OptionError("{0} {value} must give {pp} stages' layers summing to the model's {layers} (vLLM "
                              "checks both)", "pp_layer_partition", value=",".join(map(str, partition)), pp=pp,
                              layers=layers)
        return tuple(partition)
    sizes = [layers // pp] * pp
    for i in range(2, layers % pp + 2):
        sizes[-i] += 1
    return tuple(sizes)


def partition_words(split: tuple[int, ...], partition: tuple[int, ...] | None) -> str:
    layers = sum(split)
    if partition is not None:
        return (f"pipeline stages: VLLM_PP_LAYER_PARTITION={','.join(map(str, split))} places the {layers} layers "
                "(get_pp_indices)")
    if len(set(split)) == 1:
        return f"pipeline stages: {layers} layers, {split[0]} a stage (vLLM's get_pp_indices)"
    return (f"pipeline stages: {layers} layers split unevenly as vLLM does, [{','.join(map(str, split))}]: the "
            "remainder goes to the stages before the last (get_pp_indices; VLLM_PP_LAYER_PARTITION, "
            "--pp-layer-partition here, replaces it)")


def vllm_mamba_state(text: Any, dtype: str, tp: int) -> tuple[int, str] | None:
    """(bytes a sequence, arithmetic) of one recurrent layer's state on a tensor-parallel rank, in vLLM's shapes
    (MambaStateShapeCalculator): the convolution keeps conv_kernel − 1 columns, and both states are in the model's
    dtype (vLLM's --mamba-cache-dtype and --mamba-ssm-cache-dtype auto; a model whose vLLM config asks for a
    float32 SSM state holds twice the SSM part); Mamba-2's groups are padded to tp where tp does not divide them
    (extra_groups_for_head_shards). None for a family without a formula here."""
    from ..dims import config_int, mamba_dims
    from ..dtypes import itemsize

    size = itemsize(dtype)
    kind = str(getattr(text, "model_type", ""))
    per = f" / tp {tp}" if tp > 1 else ""

    def split(n: int) -> int:
        return n // tp if n % tp == 0 else -(-n // tp)
    mamba = mamba_dims(text)
    if mamba is not None and mamba.version == 1:
        inner, conv, state = mamba.inner, mamba.conv_kernel, mamba.state
        local = split(inner)
        return (local * (conv - 1) * size + local * state * size,
                f"conv {inner:,}{per} × (kernel {conv} − 1) × {size} B + ssm {inner:,}{per} × {state} × {size} B")
    if mamba is not None:
        heads, head_dim, state, groups, conv = mamba.heads, mamba.head_dim, mamba.state, mamba.groups, mamba.conv_kernel
        if not heads or not head_dim or not state:
            return None
        padded = groups if groups % tp == 0 else groups + tp - groups  # vLLM pads the groups to tp
        conv_dim = heads * head_dim + 2 * padded * state
        return (split(conv_dim) * (conv - 1) * size + split(heads) * head_dim * state * size,
                f"conv ({heads} heads × {head_dim} + 2 × {padded} groups × {state}){per} × (kernel {conv} − 1) "
                f"× {size} B + ssm {heads} heads{per} × {head_dim} × {state} × {size} B")
    if kind in ("qwen3_next", "qwen3_5", "qwen3_5_moe"):
        k_heads = config_int(text, "linear_num_key_heads") or 0
        v_heads = config_int(text, "linear_num_value_heads") or 0
        k_dim = config_int(text, "linear_key_head_dim") or 0
        v_dim = config_int(text, "linear_value_head_dim") or 0
        conv = config_int(text, "linear_conv_kernel_dim") or 4
        conv_dim = 2 * k_heads * k_dim + v_heads * v_dim
        return (split(conv_dim) * (conv - 1) * size + split(v_heads) * k_dim * v_dim * size,
                f"conv (2 × {k_heads} × {k_dim} + {v_heads} × {v_dim}){per} × (kernel {conv} − 1) × {size} B + "
                f"state {v_heads} heads{per} × {k_dim} × {v_dim} × {size} B")
    return None
