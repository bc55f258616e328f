"""The KV cache of a generating model, from its config: per token, and at a batch and context length.

Pure arithmetic on config fields (read with getattr, so transformers' attribute maps apply: GPT-2's n_head is
num_attention_heads). It mirrors what transformers' DynamicCache holds, layer by layer:

- layer kinds come from the config as `get_layer_types_and_kwargs` reads them: `layer_types` when given, else
  every layer sliding when `sliding_window` is set, chunked when `attention_chunk_size` is, full otherwise;
  layers that reuse another layer's cache (`kv_sharing_modes`) and "moe"/"mlp" layers hold none;
- a full layer holds every token: 2 (K and V) × kv_heads × head_dim per token; kv_heads and head_dim are the
  config's (never hidden ÷ heads where head_dim is given), except where the class caches more heads than the
  config declares: Falcon's new decoder architecture (Falcon-40B/180B) broadcasts its key/value heads to every
  query head before it writes the cache (modeling_falcon.py), so its cache holds num_attention_heads;
- a sliding or chunked layer keeps its last `window − 1` tokens (DynamicSlidingWindowLayer);
- multi-head latent attention (MLA: `kv_lora_rank`) is cached either as the latent, kv_lora_rank + the rope
  dimension per token (one "head"), or expanded to per-head K (qk_nope + qk_rope) and V (v_head_dim);
  which one a class's cache stores is the implementation's choice, measured by `traced/cache_probe.py`;
- state-space and linear-attention layers keep a fixed recurrent state per sequence instead of a growing cache;
- an encoder-decoder's decoder layers also cache the cross-attention K and V of the encoder's output.

Layouts: "kv" is transformers' (K and V per head, as the class caches them); "grouped" keeps K and V once per
key/value head as the config declares them, whatever the class does (what servers with grouped-query kernels,
vLLM's paged cache among them, keep); "latent" and "expanded" are MLA's two. Each figure carries the convention
it follows (`KVCache.convention`).

Across GPUs (`tp`, `layers`: one rank of a tensor-parallel group, one pipeline stage's layers), as vLLM keeps it:
K and V heads split over the tp ranks, and once tp exceeds them each rank keeps the one head its query heads read
(replicated tp / kv_heads times); MLA's latent is one "head" that every rank keeps whole (replicated); MLA
expanded splits its heads; a recurrent state splits its channels and heads (Mamba's inner channels, Mamba-2's heads
with its groups, replicated where fewer than tp, linear attention's key and value heads); a stage holds its own
layers' cache only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..dims import config_int, decoder_layers, dim, is_mla, mamba_dims, text_config
from ..dtypes import itemsize, short_name

CONVENTION = ("transformers' DynamicCache: a full layer holds every token; a sliding-window layer keeps its last "
              "window − 1 tokens")
_WINDOWS = "a full layer holds every token, a sliding-window layer its last window − 1 tokens"
# The conventions of the layouts asked for by name (--kv-layout), which need not be what transformers' cache holds.
LAYOUT_CONVENTIONS = {
    "grouped": ("--kv-layout grouped: K and V once per key/value head as the config declares them "
                "(num_key_value_heads), as servers with grouped-query kernels keep them (vLLM's paged cache, before "
                f"its block rounding), not necessarily what transformers' cache holds (--kv-layout hf); {_WINDOWS}"),
    "latent": ("--kv-layout latent: MLA's compressed latent, kv_lora_rank + qk_rope_head_dim per token and layer, "
               "as MLA-aware servers (vLLM, SGLang) keep it, not necessarily what transformers' cache holds "
               f"(--kv-layout hf); {_WINDOWS}"),
    "expanded": ("--kv-layout expanded: MLA decompressed, per-head K (qk_nope + qk_rope) and V (v_head_dim) per "
                 "token and layer, not necessarily what transformers' cache holds (--kv-layout hf); "
                 f"{_WINDOWS}"),
}


@dataclass(frozen=True)
class CacheGroup:
    kind: str  # "full attention", "sliding window 4,096", "MLA latent", "cross-attention", "recurrent state"
    layers: int
    tokens: int  # tokens each of these layers holds, per sequence
    per_token: int  # bytes per token per sequence, these layers together (0 for a recurrent state)
    fixed: int  # bytes per sequence that do not grow with tokens, these layers together
    bytes: int  # at the batch and context length asked
    arithmetic: str  # per layer and token, e.g. "2 × 8 kv heads × 128 × 2 B"
    constant: int = 0  # bytes whatever the batch: a sliding layer's window, held as an int64 tensor (8 B)


@dataclass(frozen=True)
class KVCache:
    bytes: int  # at batch × seq
    bytes_per_token: int  # one more token of one sequence, while it is inside every window
    layout: str  # "kv" (as transformers caches it) | "grouped" (per key/value head) | "latent" | "expanded" (MLA)
    dtype: str
    batch: int
    seq: int
    groups: tuple[CacheGroup, ...]
    convention: str = CONVENTION
    notes: tuple[str, ...] = ()
    heads: int | None = None  # "kv": the K and V heads per layer measured on the real cache, where not the formula's
    tp: int = 1  # one rank's share under tensor parallelism of this degree (1: the whole cache)

    def at(self, batch: int, seq: int) -> int:
        """Bytes at another batch and context length (windows and fixed states included)."""
        return sum(batch * (g.fixed + g.per_token * _held(g, seq)) + g.constant for g in self.groups)

    def prefill_extra(self, batch: int, seq: int) -> int:
        """Bytes a windowed layer's cache still holds beyond its window as the prefill ends: transformers keeps a
        slice of the whole prompt's K and V (a view, so their storage), until the first decode step concatenates."""
        return sum(batch * g.per_token * (seq - _held(g, seq)) for g in self.groups if _window_of(g.kind))


def _held(group: CacheGroup, seq: int) -> int:
    window = _window_of(group.kind)
    return seq if window is None else min(seq, window - 1)


def _window_of(kind: str) -> int | None:
    if kind.startswith(("sliding window ", "chunked ")):
        return int(kind.rsplit(" ", 1)[1].replace(",", ""))
    return None


def layer_kinds(config: Any) -> list[tuple[str, int | None]]:
    """(kind, window) per decoder layer, as transformers' get_layer_types_and_kwargs reads the config."""
    count = decoder_layers(config)
    types = getattr(config, "layer_types", None)
    if not isinstance(types, (list, tuple)) or not types:
        if config_int(config, "sliding_window") is not None:
            types = ["sliding_attention"] * count
        elif config_int(config, "attention_chunk_size") is not None:
            types = ["chunked_attention"] * count
        else:
            types = ["full_attention"] * count
    sharing = getattr(config, "kv_sharing_modes", None)
    kinds = []
    for index, kind in enumerate(types):
        kind = str(kind)
        if isinstance(sharing, (list, tuple)) and index < len(sharing) and sharing[index] == "reuse":
            kind = "shared"
        if kind in ("moe", "mlp"):  # no attention in this layer
            kind = "none"
        window = None
        if kind in ("sliding_attention", "hybrid_sliding"):
            window = config_int(config, "sliding_window")
        elif kind == "chunked_attention":
            window = config_int(config, "attention_chunk_size")
        kinds.append((kind, window))
    return kinds


def attention_shape(config: Any) -> tuple[int, int, int, str]:
    """(kv heads, K head dim, V head dim, how they were found) of a decoder's self-attention."""
    if getattr(config, "is_encoder_decoder", False):
        heads = config_int(config, "decoder_attention_heads", "num_attention_heads", "num_heads", "n_head")
    else:
        heads = dim(config, "heads")
    heads = heads or 1
    kv_heads = dim(config, "kv_heads")
    how = "num_key_value_heads" if kv_heads else "num_attention_heads (no key/value head count given)"
    if getattr(config, "multi_query", False) and not getattr(config, "new_decoder_architecture", False):
        kv_heads, how = 1, "multi_query: one key/value head"
    kv_heads = kv_heads or heads
    head_dim = dim(config, "head_dim")
    hidden = dim(config, "hidden") or 0
    if head_dim is None:
        head_dim = hidden // heads if heads else 0
        dim_how = f"hidden_size ÷ heads = {hidden:,} ÷ {heads}"
    else:
        dim_how = "head_dim"
    return kv_heads, head_dim, head_dim, f"{how}; {dim_how}"


def cached_heads(config: Any) -> tuple[int, str]:
    """(K and V heads per layer that transformers' cache holds, in the arithmetic's words): the config's key/value
    heads, or every query head for a class that broadcasts them before writing the cache (Falcon's new decoder
    architecture: FalconAttention's `num_kv_heads = num_heads if new_decoder_architecture`)."""
    kv_heads = attention_shape(config)[0]
    if getattr(config, "model_type", None) == "falcon" and getattr(config, "new_decoder_architecture", False):
        heads = dim(config, "heads") or kv_heads
        if heads != kv_heads:
            return heads, f"{heads} heads ({kv_heads} kv heads broadcast to every query head)"
    return kv_heads, f"{kv_heads} kv heads"


def kv_cache(config: Any, *, batch: int, seq: int, dtype: str, layout: str = "kv",
             encoder_seq: int | None = None, heads: int | None = None, convention: str | None = None,
             tp: int = 1, layers: Any = None) -> KVCache:
    """The cache after a prefill of `seq` tokens for `batch` sequences (decoding further grows it the same way).

    `layout`: "kv" (as transformers caches it: `cached_heads`) or "grouped" (the config's key/value heads) without
    MLA; "latent" (kv_lora_rank + rope per token) or "expanded" (per-head K and V) with MLA. `heads` replaces the
    K and V heads per layer of "kv" (a count measured on the real cache); `convention` replaces the layout's.
    `tp`: one tensor-parallel rank's share (the module docstring says how each kind splits); `layers`: the decoder
    layer indices held (a pipeline stage's), every layer when None.
    """
    config = text_config(config)
    size = itemsize(dtype)
    kinds = layer_kinds(config)
    # Llama-3.2-Vision's cross-attention layers attend to the image tiles, not the text: on a text input transformers
    # skips them (no cache entry); with images each caches the K and V of the projected tiles (`encoder_seq` of them)
    vision_cross = frozenset(int(i) for i in getattr(config, "cross_attention_layers", None) or ())
    kinds = [("vision cross-attention", None) if index in vision_cross else kind for index, kind in enumerate(kinds)]
    held_layers = frozenset(layers) if layers is not None else None
    if held_layers is not None:
        kinds = [kind for index, kind in enumerate(kinds) if index in held_layers]
    mla = is_mla(config)
    if mla and layout not in ("latent", "expanded"):
        layout = "latent"
    if not mla and layout != "grouped":
        layout = "kv"
    per_layer, arithmetic = _attention_bytes_per_token(config, size, layout, heads, tp)
    groups: dict[str, list[Any]] = {}
    notes: list[str] = []
    recurrent = _recurrent_state(config, size, tp)
    cross_layers = 0
    for kind, window in kinds:
        if kind in ("full_attention", "indexed_attention", "hybrid"):
            key = "MLA latent" if layout == "latent" else "MLA expanded" if layout == "expanded" else "full attention"
        elif kind in ("sliding_attention", "chunked_attention", "hybrid_sliding") and window:
            key = f"{'chunked' if kind == 'chunked_attention' else 'sliding window'} {window:,}"
        elif kind in ("shared", "none"):
            continue
        elif kind == "vision cross-attention":
            cross_layers += 1
            continue
        elif kind in ("linear_attention", "conv", "mamba", "mamba2", "ssm", "recurrent", "attention_free"):
            key = "recurrent state"
        else:  # an unknown kind: treat as full attention and say so
            key = "full attention"
            notes.append(f"layer type {kind!r} is not known to paramscope; counted as full attention")
        entry = groups.setdefault(key, [0, 0, 0])
        entry[0] += 1
        if key == "recurrent state":
            if recurrent is None:
                notes.append("this model's recurrent state has no formula here; `--trace` measures it")
            else:
                entry[2] += recurrent[0]
        else:
            entry[1] += per_layer
            if kind in ("hybrid", "hybrid_sliding") and recurrent is not None:
                entry[2] += recurrent[0]
    result = []
    for key, (layers, per_token, fixed) in groups.items():
        group = CacheGroup(key, layers, 0, per_token, fixed, 0,
                           recurrent[1] if key == "recurrent state" and recurrent else arithmetic)
        held = _held(group, seq)
        constant = 8 * layers if _window_of(key) is not None else 0
        result.append(CacheGroup(key, layers, held, per_token, fixed,
                                 batch * (fixed + per_token * held) + constant, group.arithmetic, constant))
    if cross_layers and encoder_seq is None:
        notes.append(f"the {cross_layers} cross-attention layers read the image tiles, not the text: a text input "
                     "skips them, so they cache nothing")
    elif cross_layers:  # their K and V heads and dims are the self-attention's; they hold the vision tokens
        fixed = cross_layers * per_layer * encoder_seq
        result.append(CacheGroup("cross-attention", cross_layers, encoder_seq, 0, fixed, batch * fixed,
                                 f"{arithmetic} × {encoder_seq:,} vision tokens"))
    if getattr(config, "is_encoder_decoder", False):
        cross = _cross_attention(config, size, encoder_seq or seq, tp, held_layers)
        if cross is not None:
            result.append(CacheGroup("cross-attention", cross[0], encoder_seq or seq, 0, cross[1],
                                     batch * cross[1], cross[2]))
    total = sum(g.bytes for g in result)
    bytes_per_token = sum(g.per_token for g in result)
    return KVCache(total, bytes_per_token, layout, short_name(dtype), batch, seq, tuple(result),
                   convention=convention or (LAYOUT_CONVENTIONS["grouped"] if layout == "grouped" else CONVENTION),
                   notes=tuple(dict.fromkeys(notes)), heads=heads if layout == "kv" else None, tp=tp)


def rank_heads(heads: int, tp: int) -> int:
    """K and V heads one tensor-parallel rank keeps of `heads`: heads / tp, or the one head its query heads read
    once tp exceeds them (vLLM's and Megatron's replication; rules.place refuses a tp that splits them unevenly)."""
    return max(1, -(-heads // tp))


def _heads_words(heads: int, label: str, tp: int) -> str:
    if tp == 1:
        return label
    if tp <= heads:
        return f"{label} / tp {tp} = {rank_heads(heads, tp)} a rank"
    return f"1 head a rank ({label}, replicated past them over tp {tp})"


def _attention_bytes_per_token(config: Any, size: int, layout: str, heads: int | None = None,
                               tp: int = 1) -> tuple[int, str]:
    """Bytes per token of one attention layer (one tensor-parallel rank's share of it), and the arithmetic."""
    if layout == "latent":
        rank = config_int(config, "kv_lora_rank") or 0
        rope = config_int(config, "qk_rope_head_dim") or 0
        whole = f", whole on every rank (replicated over tp {tp})" if tp > 1 else ""
        return (rank + rope) * size, f"(kv_lora_rank {rank} + qk_rope_head_dim {rope}) × {size} B{whole}"
    if layout == "expanded":
        heads = config_int(config, "num_key_value_heads", "num_attention_heads") or 1
        k_dim = (config_int(config, "qk_nope_head_dim") or 0) + (config_int(config, "qk_rope_head_dim") or 0)
        v_dim = config_int(config, "v_head_dim") or k_dim
        return (rank_heads(heads, tp) * (k_dim + v_dim) * size,
                f"{_heads_words(heads, f'{heads} heads', tp)} × (K {k_dim} + V {v_dim}) × {size} B")
    kv_heads, k_dim, v_dim, how = attention_shape(config)
    label = f"{kv_heads} kv heads"
    if layout == "kv" and heads is not None:
        if heads != kv_heads:
            label = f"{heads} heads (measured on meta; the config has {kv_heads} kv heads)"
        kv_heads = heads
    elif layout == "kv":
        kv_heads, label = cached_heads(config)
    label = _heads_words(kv_heads, label, tp)
    kv_heads = rank_heads(kv_heads, tp)
    if k_dim == v_dim:
        return 2 * kv_heads * k_dim * size, f"2 × {label} × {k_dim} × {size} B"
    return kv_heads * (k_dim + v_dim) * size, f"{label} × (K {k_dim} + V {v_dim}) × {size} B"


def _recurrent_state(config: Any, size: int, tp: int = 1) -> tuple[int, str] | None:
    """(bytes per sequence, arithmetic) of one recurrent layer's state, for the families with a formula; under `tp`
    one rank's share (channels and heads / tp, as vLLM shards the state; Mamba-2's groups replicated where there
    are fewer than tp, as vLLM pads them).

    The convolution state is in the compute dtype; the SSM and linear-attention states are float32 in
    transformers (measured on meta: traced/cache_probe.py)."""
    model_type = str(getattr(config, "model_type", ""))
    per = f" / tp {tp}" if tp > 1 else ""

    def split(n: int) -> int:
        return rank_heads(n, tp) if n else 0
    # Zamba2's cache is not measured here (traced/cache_probe.py): no formula for it
    mamba = mamba_dims(config) if model_type != "zamba2" else None
    if mamba is not None and mamba.version == 1:
        inner, conv, state = mamba.inner, mamba.conv_kernel, mamba.state
        local = split(inner)
        return (local * conv * size + local * state * 4,
                f"conv {inner:,}{per} × {conv} × {size} B + ssm {inner:,}{per} × {state} × 4 B")
    if mamba is not None:
        heads, head_dim, state, groups, conv = mamba.heads, mamba.head_dim, mamba.state, mamba.groups, mamba.conv_kernel
        local_heads = split(heads)
        local_groups = groups // tp if groups % tp == 0 else 1
        conv_dim = local_heads * head_dim + 2 * local_groups * state
        return (conv_dim * conv * size + local_heads * head_dim * state * 4,
                f"conv ({heads}{per} heads × {head_dim} + 2 × {groups}{per if groups % tp == 0 else ''} groups × "
                f"{state}) × {conv} × {size} B + ssm {heads}{per} heads × {head_dim} × {state} × 4 B"
                if tp > 1 else
                f"conv {conv_dim:,} × {conv} × {size} B + ssm {heads} heads × {head_dim} × {state} × 4 B")
    if model_type in ("qwen3_next", "qwen3_5", "qwen3_5_moe", "qwen3_5_text", "qwen3_5_moe_text"):
        k_heads = split(config_int(config, "linear_num_key_heads") or 0)
        v_heads = split(config_int(config, "linear_num_value_heads") or 0)
        k_dim = config_int(config, "linear_key_head_dim") or 0
        v_dim = config_int(config, "linear_value_head_dim") or 0
        conv = config_int(config, "linear_conv_kernel_dim") or 4
        conv_dim = 2 * k_heads * k_dim + v_heads * v_dim
        return (conv_dim * conv * size + v_heads * k_dim * v_dim * 4,
                f"conv {conv_dim:,} × {conv} × {size} B + state {v_heads} heads × {k_dim} × {v_dim} × 4 B"
                + (f" (key and value heads{per})" if tp > 1 else ""))
    if model_type in ("lfm2", "lfm2_moe"):
        hidden = config_int(config, "hidden_size") or 0
        kernel = config_int(config, "conv_L_cache") or 3
        return split(hidden) * kernel * size, f"conv {hidden:,}{per} × {kernel} × {size} B"
    return None


def _cross_attention(config: Any, size: int, encoder_seq: int, tp: int = 1,
                     held: Any = None) -> tuple[int, int, str] | None:
    layers = decoder_layers(config) if held is None else len(held)
    kv_heads, k_dim, v_dim, _ = attention_shape(config)
    label = _heads_words(kv_heads, f"{kv_heads} heads", tp)
    kv_heads = rank_heads(kv_heads, tp)
    per_layer = kv_heads * (k_dim + v_dim) * size * encoder_seq
    if not layers or not per_layer:
        return None
    return layers, layers * per_layer, f"{label} × (K {k_dim} + V {v_dim}) × {size} B × {encoder_seq:,} encoder tokens"
