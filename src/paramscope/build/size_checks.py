"""A config dict's sizes checked before any import or build (validate_config_dict): every size field a positive
integer (per stage where a list), within the limits (limits.py), widths that split into heads, products that fit
int64, sub-configs by path; and the layers the cost commands build (check_cost_layers), the label count."""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError, short_repr
from .field_checks import check_cost_fields
from .limits import MAX_COST_LAYERS, MAX_DIMENSION, MAX_LABELS, MAX_LAYERS

# Size fields that must be positive integers wherever a config (or a sub-config) has them (None: "derived").
_POSITIVE_INT_FIELDS = (
    "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
    "intermediate_size", "max_position_embeddings", "head_dim", "embedding_size",
    "n_embd", "n_layer", "n_head", "n_positions", "n_inner", "n_ctx",
    "d_model", "d_ff", "d_kv", "num_layers", "num_heads", "num_decoder_layers",
    "dim", "hidden_dim", "n_layers", "n_heads",
    "encoder_layers", "decoder_layers", "encoder_attention_heads", "decoder_attention_heads",
    "encoder_ffn_dim", "decoder_ffn_dim",
    "num_local_experts", "num_experts", "n_routed_experts", "moe_intermediate_size", "num_labels",
    "depth", "patch_size", "image_size", "num_channels", "num_mel_bins", "kv_lora_rank", "q_lora_rank",
    "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "shared_expert_intermediate_size", "depths",
)
# Of those, the ones transformers declares a plain int in every native config class that has them: 768.0, null or
# [768] there fails its validation only after torch and transformers are imported (seconds), so it fails here.
# Sub-configs count too; a config with auto_map (remote code) declares its own types and is left to them.
_SCALAR_INT_FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "max_position_embeddings",
                      "n_embd", "n_layer", "n_head", "n_positions")
# What transformers' own defaults give these fields besides a plain integer, and so what stays allowed: per-stage
# lists and maps of depths and heads (SegFormer, LeViT, LXMERT) and a whole-number float position count
# (MusicFlamingo's 1200.0). A width is never a list, and null, a bool or a string never describes a model.
def _scalar_exception(key: str, value: Any) -> bool:
    if isinstance(value, float):
        return key in ("max_position_embeddings", "n_positions") and value.is_integer()
    if isinstance(value, (list, dict)):
        return key not in ("hidden_size", "n_embd")
    return False


# Zero is meaningful here: head_dim 0 is "hidden size / heads" in some defaults, a rope dimension 0 is no rope part.
_MAY_BE_ZERO = ("head_dim", "qk_rope_head_dim", "q_lora_rank")
# model_type → size fields its class takes 0 for: GraniteMoeHybrid's 0 experts build the shared MLP alone
# (Granite-4.0-H-Micro's config.json)
_MAY_BE_ZERO_FOR = {"granitemoehybrid": ("num_local_experts",)}
_NON_NEGATIVE_INT_FIELDS = ("type_vocab_size", "n_shared_experts", "first_k_dense_replace")
# Fields that count blocks in a stack: each block is a dozen modules or more, so they are bounded first.
_LAYER_FIELDS = (
    "num_hidden_layers", "n_layer", "num_layers", "num_decoder_layers", "n_layers", "encoder_layers",
    "decoder_layers", "depth", "depths",
)
# (width field, heads field): the width must split evenly into heads unless head_dim is explicit.
_HEAD_SPLITS = (
    ("hidden_size", "num_attention_heads"),
    ("n_embd", "n_head"),
    ("dim", "n_heads"),
    ("d_model", "encoder_attention_heads"),
    ("d_model", "decoder_attention_heads"),
)
# (query heads, key/value heads): grouped-query attention shares each kv head among heads/kv query heads.
_KV_SPLITS = (
    ("num_attention_heads", "num_key_value_heads"),
    ("n_head", "num_key_value_heads"),
    ("num_heads", "num_key_value_heads"),
    ("n_heads", "n_kv_heads"),
)
_INT64_MAX = 2**63 - 1
_SUB_CONFIG_DEPTH = 4  # text_config.…: multimodal configs nest one or two levels


def validate_config_dict(config: dict[str, Any]) -> None:
    """Reject sizes that cannot describe a model, naming the field and the value: before any import or build.

    Sub-configs (text_config, vision_config, …) are checked the same way, their fields named by path.
    """
    _check_level(config, "", 0)
    architectures = config.get("architectures")
    if architectures is not None and (not isinstance(architectures, list)
                                      or not all(isinstance(a, str) for a in architectures)):
        raise ConfigError(f"config field 'architectures' must be a list of class names, got {short_repr(architectures)}")
    model_type = config.get("model_type")
    if model_type is not None and not isinstance(model_type, str):
        raise ConfigError(f"config field 'model_type' must be a string, got {short_repr(model_type)}")
    check_num_labels(config.get("num_labels"), "config field 'num_labels'")
    labels = config.get("id2label")
    if isinstance(labels, dict) and len(labels) > MAX_LABELS:
        raise ConfigError(f"config field 'id2label' has {len(labels):,} labels, more than the {MAX_LABELS:,} "
                          "paramscope builds")


def check_cost_layers(config: dict[str, Any]) -> None:
    """Refuse, before a build, a config with more than MAX_COST_LAYERS layers in a stack (memory and flops build at
    most that many; inspect takes up to MAX_LAYERS), naming the field and the bound."""

    def visit(level: dict[str, Any], prefix: str, depth: int) -> None:
        for key in _LAYER_FIELDS:
            items = _size_items(level.get(key)) if level.get(key) is not None else None
            if items and sum(items) > MAX_COST_LAYERS:
                raise ConfigError(f"config field {prefix + key!r} is {sum(items):,}, more than the {MAX_COST_LAYERS:,} "
                                  f"layers memory and flops build (they run a prefill, traces and sums over every "
                                  f"layer, about 25 ms each); inspect takes up to {MAX_LAYERS:,}")
        if depth < _SUB_CONFIG_DEPTH:
            for key, value in level.items():
                if isinstance(value, dict) and key not in ("id2label", "label2id", "auto_map"):
                    visit(value, f"{prefix}{key}.", depth + 1)

    if isinstance(config, dict):
        visit(config, "", 0)


def check_num_labels(value: Any, what: str | None = None) -> None:
    """`what`: the words for where the value came from ("config field 'num_labels'"); None: the num_labels option
    (which the CLI spells --num-labels)."""
    if value is None:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ConfigError(f"{what or '{0}'} must be a positive integer, got {{value}}", *([] if what else ["num_labels"]),
                          value=short_repr(value))
    if value > MAX_LABELS:
        raise ConfigError(f"{what or '{0}'} is {{value:,}}, more than the {{limit:,}} labels paramscope builds "
                          "(transformers makes an id2label entry for each)", *([] if what else ["num_labels"]),
                          value=value, limit=MAX_LABELS)


def _check_level(config: dict[str, Any], prefix: str, depth: int) -> None:
    def name(key: str) -> str:
        return f"{prefix}{key}"

    dims: list[tuple[int, str]] = []
    if "auto_map" not in config and (depth == 0 or "model_type" in config):
        for key in _SCALAR_INT_FIELDS:
            if key in config and type(config[key]) is not int and not _scalar_exception(key, config[key]):
                value = config[key]
                shown = "null" if value is None else short_repr(value)
                raise ConfigError(f"config field {name(key)!r} must be an integer, got {shown}"
                                  + (f" (write {int(value)})" if isinstance(value, float) and value.is_integer()
                                     and abs(value) < 2**63 else ""))
    for key in _POSITIVE_INT_FIELDS:
        value = config.get(key)
        if value is None or (value == 0 and (key in _MAY_BE_ZERO
                                             or key in _MAY_BE_ZERO_FOR.get(config.get("model_type"), ()))):
            continue
        items = _size_items(value)
        if items is None:
            raise ConfigError(f"config field {name(key)!r} must be an integer, got {short_repr(value)}")
        for item in items:
            if item <= 0:
                raise ConfigError(f"config field {name(key)!r} must be positive, got {short_repr(value)}")
            if item > MAX_DIMENSION:
                raise ConfigError(f"config field {name(key)!r} is {item:,}, larger than any tensor dimension "
                                  f"({MAX_DIMENSION:,} = 2^31 − 1)")
        dims.append((max(items), key))
        if key in _LAYER_FIELDS and sum(items) > MAX_LAYERS:
            raise ConfigError(f"config field {name(key)!r} is {sum(items):,}, more than the {MAX_LAYERS:,} layers "
                              "paramscope builds")
    for key in _NON_NEGATIVE_INT_FIELDS:
        value = config.get(key)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ConfigError(f"config field {name(key)!r} must be a non-negative integer, got {short_repr(value)}")
        if value > MAX_DIMENSION:
            raise ConfigError(f"config field {name(key)!r} is {value:,}, larger than any tensor dimension "
                              f"({MAX_DIMENSION:,} = 2^31 − 1)")
    # A weight's element count is a product of up to three of these (experts × intermediate × hidden).
    top = sorted(dims, reverse=True)[:3]
    product = 1
    for value, _ in top:
        product *= value
    if product > _INT64_MAX:
        fields = " × ".join(f"{name(key)} {value:,}" for value, key in top)
        raise ConfigError(f"{fields} overflows a 64-bit element count")
    # Only at the top level, and only where no field gives the head size: sub-configs and many classes set it in
    # ways a config dict does not show (GLM-4.5's head_dim 128 for 4096 / 96).
    if depth == 0 and not any("head_dim" in key or "head_size" in key for key in config) \
            and config.get("embedding_size") is None:
        for width_key, heads_key in _HEAD_SPLITS:
            width, heads = config.get(width_key), config.get(heads_key)
            if type(width) is int and type(heads) is int and heads > 0 and width % heads:
                raise ConfigError(
                    f"{name(width_key)} {width} is not divisible by {name(heads_key)} {heads} "
                    f"(each head would get {width / heads:g} dimensions)"
                )
    for heads_key, kv_key in _KV_SPLITS:
        heads, kv = config.get(heads_key), config.get(kv_key)
        if type(heads) is int and type(kv) is int and kv > 0 and heads % kv:
            raise ConfigError(f"{name(heads_key)} {heads} is not divisible by {name(kv_key)} {kv} (grouped-query "
                              "attention shares each key/value head among a whole number of query heads)")
    check_cost_fields(config, name)
    if depth < _SUB_CONFIG_DEPTH:
        for key, value in config.items():
            if isinstance(value, dict) and key not in ("id2label", "label2id", "auto_map"):
                _check_level(value, f"{name(key)}.", depth + 1)


def _size_items(value: Any) -> list[int] | None:
    """The integers a size field holds: one, or one per stage, axis or layer (Swin's num_heads [3, 6, 12, 24],
    image_size [384, 384], Gemma 3n's intermediate_size per layer, LXMERT's layers per encoder); None if any is not
    an integer. Whole floats (1200.0, as some defaults write them) count as integers."""
    items = list(value.values()) if isinstance(value, dict) else value if isinstance(value, list) else [value]
    out = []
    for item in items:
        if isinstance(item, float) and item.is_integer() and abs(item) < 2**63:
            item = int(item)
        if type(item) is not int:
            return None
        out.append(item)
    return out or None
