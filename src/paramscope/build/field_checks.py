"""The fields beyond sizes that the memory and FLOP engines read, checked before any import or build
(check_cost_fields): top-k against the experts, windows, the declared dtype, label ids, rope and quantization
settings, each refused with one line when it cannot describe a model."""

from __future__ import annotations

import re
from typing import Any

from ..errors import ConfigError, short_repr
from .limits import MAX_DIMENSION

# The routed experts a token meets and the expert counts, in the order the cost engines read them (cost/dims.py:
# the first key a config sets is the one read, so it is the one checked).
_TOP_K_FIELDS = ("num_experts_per_tok", "moe_top_k", "top_k", "num_selected_experts")
_EXPERT_FIELDS = ("num_local_experts", "n_routed_experts", "num_experts", "moe_num_experts")
WINDOW_FIELDS = ("sliding_window", "attention_chunk_size")
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


def check_cost_fields(config: dict[str, Any], name) -> None:
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
    for key in WINDOW_FIELDS:
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
            from ..cost.memory.quantization import group_size_problem

            problem = group_size_problem(quant[key])
            if problem:
                raise ConfigError(f"config field {field(key)} {problem}")
            break  # the first key set is the one read
