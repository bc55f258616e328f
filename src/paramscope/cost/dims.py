"""Config dimensions as the cost engines read them: the text config, positive integers by their keys, dropouts.

Every reader goes through getattr, so transformers' attribute maps apply (GPT-2's n_head is num_attention_heads).
A value that is not a positive integer (bools included) reads as unset; the engines name what is missing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# The dimensions every engine reads, each with its keys in one order: the first a config sets to a positive integer
# wins. transformers' attribute maps already alias most of them (T5's d_model is hidden_size), so the order matters
# only for a config that sets two keys apart; one order everywhere gives one answer.
DIMENSIONS: dict[str, tuple[str, ...]] = {
    "hidden": ("hidden_size", "d_model", "n_embd"),
    "heads": ("num_attention_heads", "n_head", "num_heads"),
    "kv_heads": ("num_key_value_heads", "num_kv_heads", "n_head_kv", "multi_query_group_num"),
    "head_dim": ("head_dim", "d_kv", "kv_channels"),
    "layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "intermediate": ("intermediate_size", "ffn_dim", "n_inner", "d_ff", "decoder_ffn_dim"),
    "experts": ("num_local_experts", "n_routed_experts", "num_experts", "moe_num_experts"),
    "top_k": ("num_experts_per_tok", "moe_top_k", "top_k", "num_selected_experts"),
}


def dim(config: Any, name: str) -> int | None:
    """The dimension `name` (a key of DIMENSIONS) as the config sets it, or None when none of its keys is set."""
    return config_int(config, *DIMENSIONS[name])


def text_config(config: Any) -> Any:
    """The decoder's text config, as transformers' caches read it; an encoder-decoder's own config."""
    get = getattr(config, "get_text_config", None)
    if not callable(get):
        return config
    try:
        text = get(decoder=True)
    except TypeError:
        text = get()
    # For an encoder-decoder without sub-configs (BART), transformers returns a fresh view of the same class
    # that loses the decoder's fields; the config itself holds them.
    if text is not config and type(text) is type(config):
        return config
    return text


def config_int(config: Any, *names: str) -> int | None:
    """The first of `names` that the config sets to a positive integer (bools are not integers here)."""
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def decoder_layers(config: Any) -> int:
    if getattr(config, "is_encoder_decoder", False):
        value = config_int(config, "num_decoder_layers", "decoder_layers")
        if value:
            return value
    return config_int(config, "num_hidden_layers", "n_layer", "num_layers") or 0


def is_mla(config: Any) -> bool:
    return config_int(config, "kv_lora_rank") is not None


def same_head_sizes(config: Any) -> bool:
    """Whether queries and values have one head size (False for MLA with a rope part, DeepSeek-V3's 192 and 128):
    torch's CPU sdpa fuses only then, so a fake-tensor trace of unequal sizes runs the math kernel, which keeps the
    S² scores a GPU's fused kernel does not."""
    if not is_mla(config):
        return True
    d_qk = (config_int(config, "qk_nope_head_dim") or 0) + (config_int(config, "qk_rope_head_dim") or 0)
    return d_qk == (config_int(config, "v_head_dim") or d_qk)


# the families whose mixer is Mamba's (Jamba's too) or Mamba-2's, by model_type
MAMBA_FAMILIES = ("mamba", "jamba")
MAMBA2_FAMILIES = ("mamba2", "bamba", "granitemoehybrid", "nemotron_h", "falcon_h1", "zamba2")


@dataclass(frozen=True)
class MambaDims:
    """A Mamba layer's dimensions as its config gives them (mamba_dims): Mamba's `inner` channels (version 1), or
    Mamba-2's `heads` of `head_dim` in `groups` groups (version 2); the SSM state size and the convolution's kernel.
    Each cache keeps its own convention on them (memory/kv.py transformers', memory/vllm_layers.py vLLM's)."""

    version: int
    state: int
    conv_kernel: int
    inner: int = 0
    heads: int = 0
    head_dim: int = 0
    groups: int = 1


def mamba_dims(config: Any) -> MambaDims | None:
    """The Mamba layer's dimensions of a config whose model_type has a Mamba or Mamba-2 mixer, each by its keys in
    one order (Jamba's channels mamba_expand × hidden, its intermediate_size the MLP's; Mamba-2's heads, head size,
    state and groups under each family's names: Nemotron-H's mamba_num_heads, mamba_head_dim and ssm_state_size, its
    head_dim attention's; Zamba2's n_mamba_heads, mamba_headdim and mamba_ngroups); None for any other family."""
    kind = str(getattr(config, "model_type", ""))
    if kind in MAMBA_FAMILIES:
        hidden = config_int(config, "hidden_size") or 0
        inner = config_int(config, "intermediate_size") if kind == "mamba" else (
            (config_int(config, "mamba_expand") or 2) * hidden)
        return MambaDims(1, config_int(config, "state_size", "mamba_d_state") or 16,
                         config_int(config, "conv_kernel", "mamba_d_conv") or 4, inner=inner or 0)
    if kind in MAMBA2_FAMILIES:
        return MambaDims(2, config_int(config, "mamba_d_state", "ssm_state_size", "state_size") or 0,
                         config_int(config, "mamba_d_conv", "conv_kernel") or 4,
                         heads=config_int(config, "mamba_n_heads", "mamba_num_heads", "n_mamba_heads",
                                          "num_heads") or 0,
                         head_dim=config_int(config, "mamba_d_head", "mamba_head_dim", "mamba_headdim",
                                             "head_dim") or 0,
                         groups=config_int(config, "mamba_n_groups", "n_groups", "mamba_ngroups") or 1)
    return None


def config_dims(config: Any, **fields: str | tuple[str, ...]) -> tuple[int, ...] | str:
    """The config's positive integers for `fields` (name → its key, or keys tried in order), in that order; or,
    when any is unset, the words naming the first key of each missing one."""
    keys = {name: (key,) if isinstance(key, str) else key for name, key in fields.items()}
    values = {name: config_int(config, *names) for name, names in keys.items()}
    absent = [names[0] for name, names in keys.items() if values[name] is None]
    return "a config without " + ", ".join(absent) if absent else tuple(values.values())


def missing(**fields: Any) -> str:
    return "a config without " + ", ".join(name for name, value in fields.items() if value is None)


def attention_dropout(config: Any) -> float:
    """The attention-probability dropout a config sets for training (0 when none)."""
    return first_positive(config, ("attn_pdrop", "attention_probs_dropout_prob", "attention_dropout",
                                    "attention_dropout_prob", "dropout_rate"))  # T5: one rate for both


def hidden_dropout(config: Any) -> float:
    """The dropout on a layer's outputs a config sets for training (0 when none)."""
    return first_positive(config, ("resid_pdrop", "hidden_dropout_prob", "hidden_dropout", "dropout",
                                    "dropout_rate"))


def first_positive(config: Any, keys: tuple[str, ...]) -> float:
    for key in keys:
        value = getattr(config, key, None)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
            return float(value)
    return 0.0


MAX_SEQ = 1 << 24  # the longest sequence any command takes


# Model types whose learned position table starts its positions past the padding id: RoBERTa and its kin number a
# token's position padding_idx + 1 + its index (transformers' create_position_ids_from_input_ids), so a table of
# max_position_embeddings rows holds max_position_embeddings - padding_idx - 1 tokens (RoBERTa's 514 rows: 512). A
# real forward past that fails on the index; fake tensors do not check it. tests/test_dims.py holds each type's
# built class to this (the table's padding_idx is the config's pad_token_id).
PADDING_OFFSET_POSITIONS = frozenset({
    "roberta", "xlm-roberta", "xlm-roberta-xl", "camembert", "data2vec-text", "roberta-prelayernorm", "longformer",
    "xmod", "mpnet", "markuplm"})


def max_context(config: Any) -> int | None:
    """The model's longest context from its config (max_position_embeddings and its other names), or None; for a
    type whose positions start past the padding id (PADDING_OFFSET_POSITIONS), the rows those offsets take are not
    tokens."""
    value = config_int(config, "max_position_embeddings", "n_positions", "max_seq_len", "seq_length",
                       "max_target_positions")
    if value is None or value > MAX_SEQ:
        return None
    if getattr(config, "model_type", None) in PADDING_OFFSET_POSITIONS:
        pad = getattr(config, "pad_token_id", None)
        if isinstance(pad, int) and not isinstance(pad, bool) and 0 <= pad < value - 1:
            return value - pad - 1
    return value


def context_source(config: Any) -> str:
    """Where max_context's figure comes from, in words (an answer's `seq_from` when no length was asked)."""
    longest = max_context(config)
    rows = config_int(config, "max_position_embeddings")
    if longest is not None and rows is not None and longest < rows:
        return (f"max_position_embeddings {rows:,} less the {rows - longest} rows {config.model_type}'s positions "
                "past the padding id take")
    return "max_position_embeddings"
