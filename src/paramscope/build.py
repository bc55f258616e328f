"""From a config dict to a model on the meta device: validate, choose the class, build.

torch and transformers are imported inside the functions, so that `import paramscope` stays light.
"""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass
from typing import Any

from .errors import ConfigError, ModelClassError, RemoteCodeError, short_repr

# Pipeline task names and the notes' use-case names → transformers' auto-model mapping, what it builds in words,
# and the auto class whose auto_map entry names a remote-code model's class for it.
TASKS: dict[str, tuple[str, str, str]] = {
    "feature-extraction": ("MODEL_MAPPING_NAMES", "the bare model (AutoModel)", "AutoModel"),
    "text-classification": ("MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES", "sequence classification",
                            "AutoModelForSequenceClassification"),
    "token-classification": ("MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES", "token classification",
                             "AutoModelForTokenClassification"),
    "fill-mask": ("MODEL_FOR_MASKED_LM_MAPPING_NAMES", "masked language modelling", "AutoModelForMaskedLM"),
    "question-answering": ("MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES", "extractive question answering",
                           "AutoModelForQuestionAnswering"),
    "multiple-choice": ("MODEL_FOR_MULTIPLE_CHOICE_MAPPING_NAMES", "multiple choice", "AutoModelForMultipleChoice"),
    "pretraining": ("MODEL_FOR_PRETRAINING_MAPPING_NAMES", "pretraining heads", "AutoModelForPreTraining"),
    "next-sentence-prediction": ("MODEL_FOR_NEXT_SENTENCE_PREDICTION_MAPPING_NAMES", "next-sentence prediction",
                                 "AutoModelForNextSentencePrediction"),
    "text-generation": ("MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", "causal language modelling (generation)",
                        "AutoModelForCausalLM"),
    "text2text-generation": ("MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES", "sequence-to-sequence generation",
                             "AutoModelForSeq2SeqLM"),
}
TASK_ALIASES: dict[str, str] = {
    "sentiment": "text-classification",
    "sentiment-analysis": "text-classification",
    "topic": "text-classification",
    "spam": "text-classification",
    "intent": "text-classification",
    "sequence-classification": "text-classification",
    "ner": "token-classification",
    "pos": "token-classification",
    "chunking": "token-classification",
    "mlm": "fill-mask",
    "qa": "question-answering",
    "generation": "text-generation",
    "causal-lm": "text-generation",
    "summarization": "text2text-generation",
    "translation": "text2text-generation",
    "nsp": "next-sentence-prediction",
    "base": "feature-extraction",
}

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

# Bounds, documented in the README ("Limits"): each lies far above every real model and far below what would
# cost minutes or gigabytes to build on meta (about 0.3 ms and a few KB per module).
MAX_LAYERS = 1024  # the deepest published transformer (DeepNet) has 1,000 layers
MAX_MODULES = 15_000  # Llama-3.1-405B builds 1,645 modules, DeepSeek-V3 1,215; 15,000 take about 4 s
MAX_DIMENSION = 2**31 - 1  # no tensor dimension is larger; products of three stay inside int64
MAX_LABELS = 100_000  # transformers builds an id2label entry per label: 1,000,000 cost 12 s and 650 MB
# `memory` and `flops` run more than a build per layer (a prefill on meta to check the KV cache, traces, analytic
# sums): about 25-30 ms a layer on a 2-core machine, so a 1,024-layer build took 22-36 s there. They build at most
# this many, within 30 s; inspect, compare and diff build up to MAX_LAYERS.
MAX_COST_LAYERS = 512
_INT64_MAX = 2**63 - 1
_SUB_CONFIG_DEPTH = 4  # text_config.…: multimodal configs nest one or two levels


@dataclass(frozen=True)
class ClassChoice:
    name: str
    reason: str
    code_ref: str | None = None  # auto_map reference of a remote-code class ("modeling_x.MyModel")


def transformers_version() -> str:
    import transformers

    return transformers.__version__


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
    _check_cost_fields(config, name)
    if depth < _SUB_CONFIG_DEPTH:
        for key, value in config.items():
            if isinstance(value, dict) and key not in ("id2label", "label2id", "auto_map"):
                _check_level(value, f"{name(key)}.", depth + 1)


# The routed experts a token meets and the expert counts, in the order the cost engines read them (cost/dims.py:
# the first key a config sets is the one read, so it is the one checked).
_TOP_K_FIELDS = ("num_experts_per_tok", "moe_top_k", "top_k", "num_selected_experts")
_EXPERT_FIELDS = ("num_local_experts", "n_routed_experts", "num_experts", "moe_num_experts")
_WINDOW_FIELDS = ("sliding_window", "attention_chunk_size")
# Config classes whose sliding_window is read only when use_sliding_window is true (default false): there 0 is how
# transformers itself writes "no window" (Qwen2-MoE's __init__ sets it when the flag is off)
_WINDOW_FLAG_TYPES = frozenset({"qwen2", "qwen2_moe", "qwen2_vl", "qwen2_5_vl", "qwen2_5_omni", "qwen3", "qwen3_moe",
                                "smollm3"})
# dtype names a config may declare (transformers' torch_dtype / dtype), as torch spells them: the floating types a
# model is built in. transformers' config refuses "auto" (a from_pretrained argument, no torch dtype), and an integer
# or float8 default dtype fails in torch before any weight is made.
_DTYPE_NAMES = frozenset({"float32", "float", "float16", "half", "bfloat16", "float64", "double"})
_NOT_BUILD_DTYPES = frozenset({"auto", "int8", "uint8", "int16", "int32", "int64", "bool", "float8_e4m3fn",
                               "float8_e5m2"})


def _check_cost_fields(config: dict[str, Any], name) -> None:
    """The fields the memory and FLOP engines read beyond sizes, each refused with one line when it cannot describe
    a model (they would otherwise turn into silent answers: a top-k above the experts, a window of 0)."""
    experts_key = next((k for k in _EXPERT_FIELDS if type(config.get(k)) is int), None)
    if experts_key is not None:
        experts = config[experts_key]
        for key in _TOP_K_FIELDS:
            value = config.get(key)
            if value is None:
                continue
            if experts == 0 and value == 0:  # no routed experts (Granite-4.0-H-Micro's dense MLP): none picked
                break
            if type(value) is not int or not 1 <= value <= experts:
                raise ConfigError(f"config field {name(key)!r} must be a whole number of experts from 1 to the "
                                  f"{experts:,} of {name(experts_key)!r}, got {short_repr(value)}")
            break  # the first key set is the one read
    for key in _WINDOW_FIELDS:
        value = config.get(key)
        if value is None:
            continue
        if type(value) is not int or value < 0:
            raise ConfigError(f"config field {name(key)!r} must be a positive number of tokens, or null for none; "
                              f"got {short_repr(value)}")
        if value == 0 and not (key == "sliding_window" and _window_flag_off(config)):
            # transformers builds it, as a window of 0 tokens: every layer's mask hides every key, and its cache
            # keeps a negative count of tokens. Only beside use_sliding_window false is 0 "no window".
            raise ConfigError(f"config field {name(key)!r} is 0, a window of no tokens; give a positive number of "
                              "tokens, or null for none" + (" (0 means none only beside use_sliding_window false)"
                                                            if key == "sliding_window" else ""))
    for key in ("torch_dtype", "dtype"):
        value = config.get(key)
        if value is None or isinstance(value, dict):  # a dtype per sub-config is transformers' own to resolve
            continue
        spelled = value.removeprefix("torch.").lower() if isinstance(value, str) else None
        if spelled in _NOT_BUILD_DTYPES:
            raise ConfigError(f"config field {name(key)!r} is {short_repr(value)}, not a dtype a model is built in "
                              "(float32, bfloat16, float16 or float64; a checkpoint's quantisation is its "
                              "quantization_config)")
        if spelled not in _DTYPE_NAMES:
            raise ConfigError(f"config field {name(key)!r} is not a dtype: {short_repr(value)} (float32, bfloat16, "
                              "float16, …)")
    for key in ("id2label", "label2id"):
        value = config.get(key)
        if value is not None and not isinstance(value, dict):
            raise ConfigError(f"config field {name(key)!r} must be a mapping of labels, got {short_repr(value)}")
    _check_label_ids(config.get("id2label"), name)
    for key in ("rope_scaling", "rope_parameters"):
        value = config.get(key)
        if value is not None and not isinstance(value, dict):
            raise ConfigError(f"config field {name(key)!r} must be a mapping (rope_type, factor, …) or null, got "
                              f"{short_repr(value)}")
    quant = config.get("quantization_config")
    if quant is not None and not isinstance(quant, dict):
        raise ConfigError(f"config field {name('quantization_config')!r} must be a mapping, got {short_repr(quant)}")
    if isinstance(quant, dict):
        _check_quantization(quant, name)


def _window_flag_off(config: dict[str, Any]) -> bool:
    """Whether the config's class reads sliding_window only under a use_sliding_window flag, and it is off."""
    flag = config.get("use_sliding_window")
    if flag is None:
        return config.get("model_type") in _WINDOW_FLAG_TYPES  # their default is false
    return flag is False


_LABEL_ID = re.compile(r"^\s*[+-]?\d{1,18}\s*$")


def _check_label_ids(id2label: Any, name) -> None:
    """id2label's keys are label ids: transformers reads each with int(), so "x" fails it (after seconds of
    imports) and "0" beside "00" is one label, not two (the count would differ from the dict's length)."""
    if not isinstance(id2label, dict):
        return
    seen: dict[int, Any] = {}
    for key in id2label:
        if not (type(key) is int or isinstance(key, str) and _LABEL_ID.match(key)):
            raise ConfigError(f"config field {name('id2label')!r} must map label ids (integers) to names, got the key "
                              f"{short_repr(key)}")
        number = int(key)
        if number in seen:
            raise ConfigError(f"config field {name('id2label')!r} gives label id {number} twice "
                              f"({short_repr(seen[number])} and {short_repr(key)})")
        seen[number] = key


# Bits each packed format stores (transformers' GPTQ and AWQ integrations)
_QUANT_BITS = {"gptq": (2, 3, 4, 8), "awq": (4,)}


def _check_quantization(quant: dict[str, Any], name) -> None:
    def field(key: str) -> str:
        return repr(name("quantization_config." + key))

    method = str(quant.get("quant_method") or "").lower()
    flags = {key: quant.get(key, quant.get("_" + key)) for key in ("load_in_4bit", "load_in_8bit")}
    if method == "bitsandbytes" or any(flags.values()):
        for key, flag in flags.items():
            if flag is not None and type(flag) is not bool:
                raise ConfigError(f"config field {field(key)} must be true or false, got {short_repr(flag)}")
        if flags["load_in_4bit"] and flags["load_in_8bit"]:
            raise ConfigError(f"config fields {field('load_in_4bit')} and {field('load_in_8bit')} are both true; "
                              "bitsandbytes stores one or the other")
        if not any(flags.values()):
            raise ConfigError(f"config field {field('quant_method')} is 'bitsandbytes' but neither load_in_4bit nor "
                              "load_in_8bit is true: no storage is declared")
        bits = 4 if flags["load_in_4bit"] else 8
        if "bits" in quant and quant["bits"] != bits:
            raise ConfigError(f"config field {field('bits')} is {short_repr(quant['bits'])}, but "
                              f"{'load_in_4bit' if bits == 4 else 'load_in_8bit'} stores {bits}-bit weights")
        kind = quant.get("bnb_4bit_quant_type")
        if bits == 4 and kind is not None and (not isinstance(kind, str) or kind.lower() not in ("nf4", "fp4")):
            raise ConfigError(f"config field {field('bnb_4bit_quant_type')} must be 'nf4' or 'fp4', got "
                              f"{short_repr(kind)}")
        return
    if method in ("fp8", "finegrained_fp8"):
        block = quant.get("weight_block_size")
        if block is not None and not (isinstance(block, list) and len(block) == 2 and all(
                type(b) is int and 1 <= b <= MAX_DIMENSION for b in block)):
            raise ConfigError(f"config field {field('weight_block_size')} must be two positive integers (rows, "
                              f"columns) or null, got {short_repr(block)}")
        return
    if method not in _QUANT_BITS:
        return
    for key in ("bits", "w_bit"):
        if key in quant:
            bits = quant[key]
            if type(bits) is not int or bits not in _QUANT_BITS[method]:
                raise ConfigError(f"config field {field(key)} must be one of "
                                  f"{', '.join(map(str, _QUANT_BITS[method]))} for {method.upper()}, got "
                                  f"{short_repr(bits)}")
    for key in ("group_size", "q_group_size"):
        if key in quant:
            # A size that does not divide an input width is built by transformers (GPTQ's and AWQ's QuantLinear
            # store ⌈in / group⌉ groups, the last one partial: DeepSeek-V2-Lite's 10,944 in groups of 128), so it
            # is accepted; memory names each width it leaves a partial group in (quantization.partial_group_notes).
            from .cost.memory.quantization import group_size_problem

            problem = group_size_problem(quant[key])
            if problem:
                raise ConfigError(f"config field {field(key)} {problem}")
            break  # the first key set is the one read


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


def make_config(config_dict: dict[str, Any], *, num_labels: int | None = None, trust_remote_code: bool = False,
                code_location: str | None = None, model_class: str | None = None):
    """A PretrainedConfig for `config_dict`, plus notes on what was decided along the way.

    `code_location` is where a remote-code config's auto_map modules live: the folder of the config file given, or
    the hub id it came from. `model_class` lets a native class read a config whose model_type transformers lacks.
    """
    notes: list[str] = []
    config_dict = dict(config_dict)
    model_type = config_dict.get("model_type")
    auto_map = config_dict.get("auto_map")
    if model_type is None:
        raise ConfigError("config has no 'model_type': paramscope cannot tell which architecture it describes")
    validate_config_dict(config_dict)  # before importing transformers: bad input costs milliseconds
    check_num_labels(num_labels)
    from transformers import CONFIG_MAPPING

    if num_labels is not None:
        config_dict.pop("id2label", None)
        config_dict.pop("label2id", None)
        config_dict["num_labels"] = num_labels

    config_class = None
    if model_type not in CONFIG_MAPPING:
        native = _native_class(model_class)
        if native is not None:
            config_class = native.config_class
            config_dict.pop("auto_map", None)
            notes.append(f"model_type {model_type!r} is not in transformers {transformers_version()}; the config "
                         f"was read with {config_class.__name__}, the config class of --class {model_class}; "
                         "no remote code ran")
            notes.extend(config_notes(config_dict, transformers_version()))
        elif isinstance(auto_map, dict) and auto_map:
            if not trust_remote_code:
                raise RemoteCodeError(_remote_refusal(model_type, auto_map, config_dict))
            return _remote_config(config_dict, auto_map, code_location), notes
        else:
            raise ConfigError(f"unknown model_type {short_repr(model_type)}: not in transformers "
                              f"{transformers_version()}")
    elif trust_remote_code and _names_remote_config(auto_map) and code_location is not None \
            and _native_class(model_class) is None:
        # transformers' AutoConfig, trusted, reads a config whose auto_map names an AutoConfig with that remote class
        # even when model_type is native, and the Auto model classes then build auto_map's class: so does the flag.
        try:
            config = _remote_config(config_dict, auto_map, code_location)
        except RemoteCodeError as err:
            raise RemoteCodeError("{error} (without {0}, transformers' own {config_class} reads this config)",
                                  "trust_remote_code", error=str(err),
                                  config_class=CONFIG_MAPPING[model_type].__name__) from err
        notes.append(f"model_type {model_type!r} is native to transformers {transformers_version()}, but with "
                     "--trust-remote-code the config's auto_map classes were used, as transformers' Auto classes do")
        return config, notes
    else:
        notes.extend(config_notes(config_dict, transformers_version()))
        if trust_remote_code and isinstance(auto_map, dict) and auto_map and code_location is None:
            notes.append("--trust-remote-code: this source (an embedded preset or a config object) carries no code "
                         "files, so auto_map's classes could not be loaded and none ran")
        config_dict.pop("auto_map", None)
    rope = config_dict.get("rope_scaling")
    if isinstance(rope, dict) and rope.get("type") == "su" and "rope_type" not in rope:
        # Phi-3's first 128k configs called LongRoPE "su"; transformers 4 renamed it, transformers 5 rejects it.
        config_dict["rope_scaling"] = {**rope, "type": "longrope"}
    config_dict.pop("quantization_config", None)
    if config_class is None:
        config_class = CONFIG_MAPPING[model_type]
    else:
        config_dict.pop("model_type")
    try:
        with quiet_transformers():
            config = config_class.from_dict(config_dict)
    except Exception as err:  # transformers' strict validation names the field
        raise ConfigError(f"invalid {config_class.model_type or model_type} config: {_first_line(err)}") from err
    return config, notes


def config_notes(config_dict: dict[str, Any], version: str) -> tuple[str, ...]:
    """What reading a config of a native model_type decides along the way, in words (torch-free: templates
    give the same notes as a build)."""
    notes = []
    model_type = config_dict.get("model_type")
    if config_dict.get("auto_map"):
        notes.append(f"auto_map names remote code, but model_type {model_type!r} is native to transformers "
                     f"{version}: the native class was used, no remote code ran")
    rope = config_dict.get("rope_scaling")
    if isinstance(rope, dict) and rope.get("type") == "su" and "rope_type" not in rope:
        notes.append("rope_scaling type 'su' read as 'longrope' (its later name); it does not change the count")
    quantization = config_dict.get("quantization_config")
    if isinstance(quantization, dict):
        method = quantization.get("quant_method") or "unknown"
        notes.append(
            f"quantization_config ({method}) not applied: logical parameters are counted, and no quantisation "
            "backend is needed (the storage line says how the checkpoint stores them)"
        )
    return tuple(notes)


def extra_config_notes(config: dict[str, Any]) -> tuple[str, ...]:
    """Config fields that describe weights transformers does not build, so the reader knows they are not counted."""
    notes = []
    for key in _WINDOW_FIELDS:
        if config.get(key) == 0 and type(config.get(key)) is int:
            notes.append(f"{key}=0: no window, as transformers reads it; every layer attends to every token")
    labels, num_labels = config.get("id2label"), config.get("num_labels")
    if isinstance(labels, dict) and type(num_labels) is int and num_labels != len(labels):
        notes.append(f"num_labels={num_labels} and id2label's {len(labels)} labels disagree: transformers builds "
                     f"{num_labels} labels (it warns, and names them LABEL_0 …), and so does paramscope")
    mtp = config.get("num_nextn_predict_layers")
    if isinstance(mtp, int) and not isinstance(mtp, bool) and mtp > 0:
        notes.append(f"num_nextn_predict_layers={mtp}: the multi-token-prediction module ships in the checkpoint "
                     "but is not part of the transformers model, so it is not counted")
    return tuple(notes)


def _native_class(model_class: str | None):
    """The transformers class called `model_class`, if it is one (used to read an unknown model_type)."""
    if not model_class:
        return None
    import transformers

    cls = getattr(transformers, model_class, None)
    return cls if isinstance(cls, type) and getattr(cls, "config_class", None) is not None else None


# The endings of transformers' model classes (not its configs, tokenizers or PreTrainedModel bases).
_MODEL_CLASS_SUFFIXES = ("Model", "ForCausalLM", "LMHeadModel", "ForConditionalGeneration", "ForMaskedLM",
                         "ForSequenceClassification", "ForTokenClassification", "ForQuestionAnswering",
                         "ForMultipleChoice", "ForPreTraining", "ForImageClassification")


def _names_remote_config(auto_map: Any) -> bool:
    """Whether `auto_map` names a remote config class, which is what makes transformers read the config with it."""
    return isinstance(auto_map, dict) and isinstance(auto_map.get("AutoConfig"), str)


def _remote_refusal(model_type: str, auto_map: dict[str, Any], config_dict: dict[str, Any]) -> str:
    """Why a remote-code config is refused, and the way forward: --class when transformers has the class."""
    import transformers

    named = [ref.rsplit(".", 1)[-1] for ref in auto_map.values() if isinstance(ref, str) and "." in ref]
    architectures = config_dict.get("architectures") or []
    # transformers lists its names without importing their modules (and torch): a refusal stays quick
    exported = set(dir(transformers))
    natives = [name for name in dict.fromkeys([*architectures, *named])
               if name in exported and name.endswith(_MODEL_CLASS_SUFFIXES) and not name.endswith("PreTrainedModel")]
    message = (f"model_type {short_repr(model_type)} is not in transformers {transformers.__version__}; the config's "
               "auto_map names code from the model's repo. Rerun with --trust-remote-code to execute it")
    if natives:
        message += (f", or with --class {natives[0]} to build transformers' own {natives[0]} from this config "
                    "(no remote code runs)")
    return message


def _remote_config(config_dict: dict[str, Any], auto_map: dict[str, Any], code_location: str | None):
    """The config class auto_map names, from `code_location`, reading exactly `config_dict` (the file given)."""
    reference = auto_map.get("AutoConfig")
    if not isinstance(reference, str):
        raise RemoteCodeError("the config's auto_map names no AutoConfig class, so its remote code cannot read it")
    config_class = remote_class(reference, code_location)
    try:
        with quiet_transformers():
            return config_class.from_dict(config_dict)
    except Exception as err:  # broad on purpose: remote code raises what it likes; the error names it
        raise RemoteCodeError(f"the remote config class {reference} rejects this config: {_first_line(err)}") from err


def remote_class(reference: str, code_location: str | None):
    """The class `reference` ("modeling_x.MyModel") names, imported from the module file at `code_location`."""
    from transformers.dynamic_module_utils import get_class_from_dynamic_module

    if code_location is None:
        raise RemoteCodeError("remote code can only be loaded from a model directory, a config file's folder or a "
                              "hub id")
    # Offline first, as a hub id's config is read (sources.hub_offline_reason): code on the Hub (a "repo--module.Class"
    # reference, or a hub id's own files) is fetched only when HF_HUB_OFFLINE is unset and the Hub answers one quick
    # connect; otherwise only the local cache is read, and a miss is one line at once (huggingface_hub would retry a
    # dead connection five times, about 25 s, printing each).
    from .sources import hub_offline, hub_offline_reason

    offline_because = None
    if "--" in reference or not os.path.isdir(code_location):
        offline_because = hub_offline_reason()
    try:
        with quiet_transformers(), hub_offline(offline_because is not None):
            return get_class_from_dynamic_module(reference, code_location, local_files_only=offline_because is not None)
    except Exception as err:  # broad on purpose: importing remote code runs it; the error names what it raised
        if offline_because is not None and isinstance(err, OSError):
            from huggingface_hub import constants

            raise RemoteCodeError(f"could not load remote code {reference} from {code_location}: {offline_because}, "
                                  f"and the code is not in the local cache ({constants.HF_HUB_CACHE}); nothing ran") \
                from None
        raise RemoteCodeError(f"could not load remote code {reference} from {code_location}: "
                              f"{_first_line(err)}") from err


def resolve_task(task: str) -> str:
    key = task.strip().lower().replace("_", "-")
    key = TASK_ALIASES.get(key, key)
    if key not in TASKS:
        known = ", ".join(sorted(set(TASKS) | set(TASK_ALIASES)))
        raise ModelClassError(f"unknown task {task!r}; known tasks: {known}")
    return key


def choose_class(config, config_dict: dict[str, Any], *, model_class: str | None = None,
                 task: str | None = None, remote_code: bool = False) -> ClassChoice:
    """Which transformers class to build, and why, in words the report can show.

    `remote_code`: --trust-remote-code was given and the source has code files to load. Then, as transformers'
    Auto classes do, auto_map's entry for the auto class asked for wins over the native class."""
    import transformers
    from transformers.models.auto import modeling_auto

    model_type = config.model_type
    if model_class and task:
        raise ModelClassError("give {0} or {1}, not both", "model_class", "task")
    if not type(config).__module__.startswith("transformers."):
        return _remote_choice(config_dict.get("auto_map") or {}, config_dict, model_class, task)
    if remote_code and isinstance(config_dict.get("auto_map"), dict):
        choice = _remote_for_native_config(config_dict["auto_map"], config_dict, model_class, task)
        if choice is not None:
            return choice
    if model_class:
        cls = getattr(transformers, model_class, None)
        if cls is None or not isinstance(cls, type) or not hasattr(cls, "config_class"):
            raise ModelClassError(f"unknown class {model_class!r}: transformers {transformers.__version__} has no such model class")
        _check_fits(cls, model_type)
        return ClassChoice(model_class, f"--class {model_class}")
    if task:
        key = resolve_task(task)
        mapping_name, description, _ = TASKS[key]
        mapping = getattr(modeling_auto, mapping_name)
        name = mapping.get(model_type)
        if name is None:
            raise ModelClassError(f"task {task!r} ({description}) has no class for model_type {model_type!r}")
        how = f"--task {task}" + (f" (= {key})" if key != task else "")
        return ClassChoice(name, f"{how}: {description}")
    architectures = config_dict.get("architectures") or []
    if architectures:
        name = architectures[0]
        cls = getattr(transformers, name, None) if isinstance(name, str) else None
        if cls is not None and _fits(cls, model_type):
            return ClassChoice(name, "the checkpoint's own class (config architectures[0])")
    if architectures and isinstance(architectures[0], str):
        # A remote-code class name (auto_map) for a native model_type: the native class for the same head.
        for suffix, mapping_name in _HEAD_SUFFIXES:
            if architectures[0].endswith(suffix):
                native = getattr(modeling_auto, mapping_name).get(model_type)
                if isinstance(native, str) and getattr(transformers, native, None) is not None:
                    return ClassChoice(native, f"architectures[0] {architectures[0]!r} is not a transformers class; "
                                               f"{native} is the native class with the same head")
    name = modeling_auto.MODEL_MAPPING_NAMES.get(model_type)
    if name is None:
        raise ModelClassError(f"transformers has no base model class for model_type {model_type!r}")
    why = "no architectures in the config" if not architectures else f"architectures[0] {architectures[0]!r} is not a transformers class"
    return ClassChoice(name, f"AutoModel fallback ({why})")


def _remote_choice(auto_map: dict[str, Any], config_dict: dict[str, Any], model_class: str | None,
                   task: str | None) -> ClassChoice:
    """A remote-code model's class: the auto_map entry for --class, --task, architectures[0], else AutoModel."""
    references = {key: ref for key, ref in auto_map.items() if isinstance(ref, str) and key != "AutoConfig"}
    by_class = {ref.rsplit(".", 1)[-1]: ref for ref in references.values()}
    if model_class:
        if model_class not in by_class:
            raise ModelClassError("{0} {model_class}: the config's auto_map names no such class (it names {named})",
                                  "model_class", model_class=model_class, named=", ".join(by_class) or "none")
        return ClassChoice(model_class, f"--class {model_class} (remote code {by_class[model_class]})",
                           by_class[model_class])
    if task:
        key = resolve_task(task)
        auto_class = TASKS[key][2]
        if auto_class not in references:
            raise ModelClassError(f"task {task!r} needs auto_map[{auto_class!r}], which the config does not name")
        ref = references[auto_class]
        return ClassChoice(ref.rsplit(".", 1)[-1], f"--task {task}: auto_map[{auto_class!r}] = {ref} (remote code)",
                           ref)
    architectures = config_dict.get("architectures") or []
    if architectures and architectures[0] in by_class:
        return ClassChoice(architectures[0], f"the checkpoint's own class (config architectures[0]), remote code "
                                             f"{by_class[architectures[0]]}", by_class[architectures[0]])
    if "AutoModel" in references:
        ref = references["AutoModel"]
        return ClassChoice(ref.rsplit(".", 1)[-1], f"auto_map['AutoModel'] = {ref} (remote code)", ref)
    raise ModelClassError("the config's auto_map names no model class to build (no AutoModel entry, and "
                          "architectures[0] is not among its classes)")


def _remote_for_native_config(auto_map: dict[str, Any], config_dict: dict[str, Any], model_class: str | None,
                              task: str | None) -> ClassChoice | None:
    """The remote class transformers' Auto class would build from a native config whose auto_map names model
    classes but no AutoConfig (so transformers' own config class read it), or None when it would build the native
    class: --class naming a transformers class, or an auto class that auto_map does not name."""
    import transformers

    references = {key: ref for key, ref in auto_map.items() if isinstance(ref, str) and key != "AutoConfig"}
    by_class = {ref.rsplit(".", 1)[-1]: ref for ref in references.values()}
    if model_class:
        if model_class in by_class and not isinstance(getattr(transformers, model_class, None), type):
            return ClassChoice(model_class, f"--class {model_class} (remote code {by_class[model_class]})",
                               by_class[model_class])
        return None
    if task:
        auto_class = TASKS[resolve_task(task)][2]
        ref = references.get(auto_class)
        return None if ref is None else ClassChoice(
            ref.rsplit(".", 1)[-1], f"--task {task}: auto_map[{auto_class!r}] = {ref} (remote code)", ref)
    architectures = config_dict.get("architectures") or []
    if architectures and architectures[0] in by_class:
        return ClassChoice(architectures[0], f"the checkpoint's own class (config architectures[0]), remote code "
                                             f"{by_class[architectures[0]]}", by_class[architectures[0]])
    native = architectures and isinstance(architectures[0], str) and hasattr(transformers, architectures[0])
    if "AutoModel" in references and not native:  # the native choice would be AutoModel's: auto_map's wins
        ref = references["AutoModel"]
        return ClassChoice(ref.rsplit(".", 1)[-1], f"auto_map['AutoModel'] = {ref} (remote code)", ref)
    return None


# architectures[0] suffix → the auto mapping of the same head, for class names transformers does not have.
_HEAD_SUFFIXES = (
    ("ForCausalLM", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"),
    ("LMHeadModel", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"),
    ("ForConditionalGeneration", "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES"),
    ("ForMaskedLM", "MODEL_FOR_MASKED_LM_MAPPING_NAMES"),
    ("ForSequenceClassification", "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES"),
    ("ForTokenClassification", "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES"),
    ("ForQuestionAnswering", "MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES"),
)


def _fits(cls, model_type: str) -> bool:
    config_class = getattr(cls, "config_class", None)
    return getattr(config_class, "model_type", None) == model_type


def _check_fits(cls, model_type: str) -> None:
    if not _fits(cls, model_type):
        other = getattr(getattr(cls, "config_class", None), "model_type", "?")
        raise ModelClassError(f"class {cls.__name__} is for model_type {other!r}, but the config is {model_type!r}")


@contextlib.contextmanager
def quiet_transformers():
    """transformers' log lines and Python warnings stay off stderr: the report carries what matters as notes."""
    import warnings

    from transformers.utils import logging as hf_logging

    previous = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        hf_logging.set_verbosity(previous)


def build_on_meta(class_name: str, config, *, code_ref: str | None = None, code_location: str | None = None,
                  dtype: str | None = None):
    """Instantiate `class_name` from `config` with every tensor on the meta device: no memory for weights.

    `code_ref` names a remote-code class (auto_map) to import from `code_location` instead of transformers'.
    `dtype` ("bfloat16") is the default dtype during the build, as `from_pretrained(dtype=…)` sets it, so each
    tensor gets the dtype loading gives it (a tensor the code creates in float32 explicitly stays float32).
    At most MAX_MODULES modules are built: a config that slipped past the field checks still cannot cost minutes.
    """
    import transformers

    cls = remote_class(code_ref, code_location) if code_ref else getattr(transformers, class_name, None)
    if cls is None:
        raise ModelClassError(f"unknown class {class_name!r}")
    return build_class_on_meta(cls, config, dtype=dtype)


def build_class_on_meta(cls, config, *, dtype: str | None = None):
    """`cls(config)` on the meta device, in `dtype`, within the module budget (build_on_meta's core)."""
    import torch

    class_name = cls.__name__
    try:
        with quiet_transformers(), _module_budget(MAX_MODULES), torch.device("meta"), _default_dtype(dtype), \
                _config_dtypes(config, dtype):
            return cls(config)
    except (ModelClassError, RemoteCodeError):
        raise
    except _TooManyModules:
        raise ConfigError(f"{class_name} from this config has more than {MAX_MODULES:,} modules; paramscope builds "
                          "no larger model (check the layer and expert counts)") from None
    except Exception as err:  # broad on purpose: the class's own __init__ rejects a config however it likes
        raise ConfigError(f"could not build {class_name} from this config: {_first_line(err)}"
                          f"{_unset_field(config, err)}") from err


@contextlib.contextmanager
def _default_dtype(dtype: str | None):
    import torch

    if dtype is None:
        yield
        return
    previous = torch.get_default_dtype()
    torch.set_default_dtype(getattr(torch, dtype))
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


@contextlib.contextmanager
def _config_dtypes(config, dtype: str | None):
    """Every (sub-)config's dtype set to `dtype` for the build, restored after. transformers builds a composite
    model's parts through `_from_config`, each in its own sub-config's dtype, whatever the default dtype: a
    Qwen2.5-VL config declaring bfloat16 would build its language model in bf16 and its vision tower in fp32 when
    fp32 was asked."""
    if dtype is None:
        yield
        return
    import torch

    wanted = getattr(torch, dtype)
    saved: list[tuple[Any, Any]] = []
    pending, seen = [config], set()
    while pending:
        node = pending.pop()
        if id(node) in seen or len(seen) > 64:  # sub-configs nest a few levels at most; the bound is for hostile ones
            continue
        seen.add(id(node))
        if hasattr(node, "dtype"):
            saved.append((node, node.__dict__.get("dtype", _UNSET)))
            node.dtype = wanted
        for key in getattr(node, "sub_configs", {}) or {}:
            child = getattr(node, key, None)
            if child is not None and hasattr(child, "sub_configs"):
                pending.append(child)
    try:
        yield
    finally:
        for node, value in saved:
            if value is _UNSET:
                node.__dict__.pop("dtype", None)
            else:
                node.dtype = value


_UNSET = object()


class _TooManyModules(Exception):
    pass


@contextlib.contextmanager
def _module_budget(limit: int):
    """Count module registrations (torch's global hook) and stop the build past `limit`."""
    from torch.nn.modules.module import register_module_module_registration_hook

    registered = 0

    def count(_module, _name, _submodule):
        nonlocal registered
        registered += 1
        if registered > limit:
            raise _TooManyModules

    handle = register_module_module_registration_hook(count)
    try:
        yield
    finally:
        handle.remove()


def _unset_field(config: Any, err: BaseException) -> str:
    """Where the class indexed a config field left unset (LFM2-MoE's config has no default for `layer_types`, and
    its layers read `config.layer_types[i]`), the words that name it; else nothing."""
    import traceback

    if not isinstance(err, TypeError) or err.__traceback__ is None:
        return ""
    line = traceback.extract_tb(err.__traceback__)[-1].line or ""
    found = re.search(r"\bconfig\.([A-Za-z_][A-Za-z0-9_]*)\s*\[", line)
    if found is None or getattr(config, found.group(1), 0) is not None:
        return ""
    return f" (config field {found.group(1)!r} is unset, and the class reads it entry by entry)"


def _first_line(err: BaseException) -> str:
    """The first line of an exception's message, short: never a C++ backtrace or a multi-line dump."""
    try:
        text = str(err)
    except Exception:  # broad on purpose: an exception's own __str__ (remote code's, torch's) may raise
        text = ""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    first = lines[0] if lines else type(err).__name__
    if first.endswith(":") and len(lines) > 1:  # "Validation error for field 'x':" says why on the next line
        first = f"{first} {lines[1]}"
    return first if len(first) <= 300 else first[:297] + "..."
