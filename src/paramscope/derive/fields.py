"""The config's fields for a derivation: integers (candidate symbols) and flags, each under all its spellings.

A field has one entry however it is spelled: attribute_map aliases (Qwen3-MoE's num_experts is num_local_experts)
and the flat fields a sub-config is built from (Qwen2.5-VL's hidden_size is text_config.hidden_size). Fields that
never shape a parameter (metadata, runtime switches, generation settings, probabilities) are left out. Lists as long
as the layer count repeat their period when it varies. Known fields get the notes' symbols (V, D, L, N, I, …).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
from dataclasses import dataclass
from typing import Any

from ..formula_spec import ABSENT, MAX_SYMBOL_LENGTH, get_path, labels_of, read_path, set_path, symbol_problem

# Symbols in the notes' convention, in display order; the first key of a config that names each wins.
KNOWN_SYMBOLS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("V", ("vocab_size",)),
    ("D", ("hidden_size", "n_embd", "d_model", "dim", "embed_dim")),
    ("L", ("max_position_embeddings", "n_positions", "max_seq_len")),
    ("N", ("num_hidden_layers", "n_layer", "num_layers", "n_layers", "encoder_layers")),
    ("I", ("intermediate_size", "n_inner", "d_ff", "ffn_dim", "hidden_dim", "encoder_ffn_dim", "ffn_hidden_size")),
    ("T", ("type_vocab_size",)),
    ("H", ("num_attention_heads", "n_head", "num_heads", "n_heads", "encoder_attention_heads")),
    ("K", ("num_key_value_heads", "num_kv_heads", "n_kv_heads", "multi_query_group_num")),
    ("E", ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")),
    ("C", ("num_labels",)),
    ("N_dec", ("num_decoder_layers", "decoder_layers")),
    ("N_dense", ("first_k_dense_replace",)),
    ("E_sh", ("n_shared_experts", "num_shared_experts")),
    ("D_emb", ("embedding_size",)),
    ("I_dec", ("decoder_ffn_dim",)),
    ("I_moe", ("moe_intermediate_size",)),
    ("I_sh", ("shared_expert_intermediate_size",)),
    ("H_dec", ("decoder_attention_heads",)),
    ("d_h", ("head_dim", "d_kv")),
    ("B", ("relative_attention_num_buckets",)),
    ("G", ("num_hidden_groups",)),
    ("G_in", ("inner_group_num",)),
    ("r_q", ("q_lora_rank",)),
    ("r_kv", ("kv_lora_rank",)),
    ("d_rope", ("qk_rope_head_dim",)),
    ("d_nope", ("qk_nope_head_dim",)),
    ("d_v", ("v_head_dim",)),
    ("d_rot", ("rotary_dim",)),
)
SYMBOL_OF_KEY = {key: symbol for symbol, keys in KNOWN_SYMBOLS for key in keys}
_KEY_RANK = {key: i for i, (_, keys) in enumerate(KNOWN_SYMBOLS) for key in keys}

# Fields that never shape a parameter: metadata, runtime switches, generation settings, probabilities.
_SKIP_KEYS = frozenset({
    "_name_or_path", "name_or_path", "transformers_version", "architectures", "model_type", "torch_dtype", "dtype",
    "auto_map", "quantization_config", "task_specific_params", "id2label", "label2id", "problem_type",
    "output_hidden_states", "output_attentions", "return_dict", "use_return_dict", "use_cache", "torchscript",
    "chunk_size_feed_forward", "tokenizer_class", "prefix", "finetuning_task", "pruned_heads", "_commit_hash",
    "_attn_implementation", "_attn_implementation_autoset", "_experts_implementation", "output_router_logits",
    "max_length", "min_length", "num_beams", "do_sample", "temperature", "top_k", "top_p", "repetition_penalty",
    "length_penalty", "no_repeat_ngram_size", "early_stopping", "num_return_sequences", "bad_words_ids",
    "diversity_penalty", "num_beam_groups", "typical_p", "encoder_no_repeat_ngram_size", "output_scores",
    "return_dict_in_generate", "remove_invalid_values", "exponential_decay_length_penalty", "suppress_tokens",
    "begin_suppress_tokens", "forced_bos_token_id", "forced_eos_token_id", "output_past", "directionality",
    "initializer_range", "initializer_factor", "num_labels",  # num_labels: varied on its own terms
    "gradient_checkpointing", "use_bfloat16", "xla_device", "tf_legacy_loss", "is_composition",
    "cache_implementation",
})
_SKIP_RE = re.compile(
    r"dropout|_pdrop$|(^|_)eps$|epsilon|_token_ids?$|token_index$|^rope_|rope_scaling|^router_|_loss|loss_coef"
    r"|_scaling_factor$|^initializer|_std$|^pooler_(type|fc_size|num_attention_heads|num_fc_layers|size_per_head)$"
)


@dataclass(frozen=True)
class Field:
    path: str
    value: Any  # at the anchor: the config's value, else the class default
    default: Any  # the class default (ABSENT when the class declares none or derives it)
    present: bool
    annotation: str = ""


@dataclass(frozen=True)
class Fields:
    """The anchor config's fields, as `read_fields` finds them."""

    base: dict[str, Any]  # the anchor config
    config_class: type
    ints: dict[str, Field]  # path → field, in rank order (num_labels among them)
    flags: tuple[Field, ...]  # every other field: a candidate structural flag
    # template mode: integer fields the config leaves out, which the config class may derive in ways no default
    # says; they are assumed to stay unset
    unset: tuple[Field, ...]
    spellings: dict[str, tuple[str, ...]]  # path → its other spellings (aliases, flat fields)
    periodic: dict[str, tuple[str, list]]  # list path → (the int field its length follows, period)

    def config_with(self, overrides: dict[str, Any]) -> dict[str, Any]:
        """The anchor config with `overrides` (path → value) written under every spelling; per-layer lists
        (layer_types, …) follow the field that counts the layers."""
        config = copy.deepcopy(self.base)
        for path, value in overrides.items():
            if path != "num_labels":
                for spelling in self._spellings_in_base(path):
                    set_path(config, spelling, value)
            for list_path, (length_path, period) in self.periodic.items():
                if length_path == path:
                    set_path(config, list_path, [period[i % len(period)] for i in range(value)])
        return config

    def _spellings_in_base(self, path: str) -> list[str]:
        """Where to write the field at `path` in the anchor config: every spelling it uses, so that no alias keeps
        the old value; when it uses none, beside the fields the class reads it with (flat, when a sub-config is
        built from flat fields), so that a probe never creates a sub-config that shadows them."""
        spellings = [path, *self.spellings.get(path, ())]
        given = [s for s in spellings if get_path(self.base, s) is not ABSENT]
        if given:
            return given
        for spelling in sorted(spellings, key=lambda s: -s.count(".")):
            parent = spelling.rpartition(".")[0]
            if not parent or isinstance(get_path(self.base, parent), dict):
                return [spelling]
        return [path]

    def symbols(self, variables: list[str]) -> tuple[dict[str, str], dict[str, str]]:
        """(symbol → path in display order, path → symbol) for the fields a formula varies."""
        symbols: dict[str, str] = {}
        sym_of: dict[str, str] = {}
        for path in sorted(variables, key=rank):
            leaf = path.rsplit(".", 1)[-1]
            prefix = path.rsplit(".", 1)[0].split("_")[0] if "." in path else ""
            # an alias may carry the conventional name (a vision tower's depth is its num_hidden_layers)
            known = [SYMBOL_OF_KEY[k] for k in [leaf] + [a.rsplit(".", 1)[-1] for a in self.spellings.get(path, ())]
                     if k in SYMBOL_OF_KEY]
            base = known[0] if known else re.sub(r"\W", "_", leaf)
            if symbol_problem(base):  # a keyword, a dunder, a leading digit: never a symbol as it is
                base = "f_" + base.strip("_")
            base = base[:MAX_SYMBOL_LENGTH - 16]  # room for a sub-config prefix or a number (formula_spec's bound)
            name = base
            if name in symbols:
                name = f"{base}_{prefix}" if prefix else base
            n = 2
            while name in symbols:
                name = f"{base}{n}"
                n += 1
            symbols[name] = path
            sym_of[path] = name
        # display order: the notes' order for known symbols (D_text next to D), then the rest as they came
        known = [s for s, _ in KNOWN_SYMBOLS]
        arrival = list(symbols)

        def order(s: str) -> tuple[int, int]:
            head = s if s in known else s.rsplit("_", 1)[0]
            return (known.index(head) if head in known else len(known), arrival.index(s))

        ordered = sorted(symbols, key=order)
        return {s: symbols[s] for s in ordered}, sym_of


def rank(path: str) -> tuple[int, int, str]:
    """Nested fields last; known keys in the notes' order (V, D, L, N, I, T, H, K, E, …); then by name."""
    leaf = path.rsplit(".", 1)[-1]
    return (path.count("."), _KEY_RANK.get(leaf, len(_KEY_RANK)), path)


def flat_spellings(config, base: dict[str, Any], num_labels: int | None) -> dict[str, list[str]]:
    """Sub-configs some classes build from flat fields when the sub-config is not given (Qwen2.5-VL's
    text_config from hidden_size, …): such a field is one field with two spellings, `text_config.hidden_size`,
    read when text_config is given, and `hidden_size`, read when it is not. Returns sub-config path → [flat path].

    A sub-config most of whose probed fields come from flat fields is built from them: all its fields get
    both spellings (the class passes them on together). Otherwise only the fields seen coming from a flat
    field do (Qwen2.5-VL forwards tokens_per_second alone to its vision config).
    """
    from transformers import PreTrainedConfig

    spellings: dict[str, list[str]] = {}
    top_level = {f.name for f in dataclasses.fields(config)} if dataclasses.is_dataclass(config) else set()
    claimed: set[str] = set()
    for name, sub in list(vars(config).items()):
        if not isinstance(sub, PreTrainedConfig) or not dataclasses.is_dataclass(sub):
            continue
        fed, probed = _flat_fed(name, sub, top_level, base, num_labels)
        if not fed:
            continue
        fields = [f.name for f in dataclasses.fields(sub)] if 2 * len(fed) > probed else fed
        for field_name in fields:
            if field_name.startswith("_") or field_name in top_level or field_name in claimed:
                continue
            spellings.setdefault(f"{name}.{field_name}", []).append(field_name)
            claimed.add(field_name)
    return spellings


def _flat_fed(name: str, sub, top_level: set[str], base: dict[str, Any], num_labels: int | None
              ) -> tuple[list[str], int]:
    """The fields of sub-config `name` that the class fills from flat fields when `name` is not given, and how
    many were probed: each integer and boolean field is given flat, changed, and read back from the
    sub-config (all at once; one at a time when the class rejects that combination). Fields of the wrapper
    itself (`top_level`) are left out: given flat, they are the wrapper's."""
    changed: dict[str, Any] = {}
    for f in dataclasses.fields(sub):
        value = getattr(sub, f.name, None)
        if f.name.startswith("_") or f.name in top_level or f.name in _SKIP_KEYS:
            continue
        if isinstance(value, bool):
            changed[f.name] = not value
        elif isinstance(value, int):
            changed[f.name] = value * 2 if value > 0 else 2
        elif value is None and "int" in str(f.type):
            changed[f.name] = 2
    found = _read_back(name, changed, base, num_labels)
    if found is None:
        found = [k for k, v in changed.items() if _read_back(name, {k: v}, base, num_labels)]
    return found, len(changed)


def _read_back(name: str, flat: dict[str, Any], base: dict[str, Any], num_labels: int | None) -> list[str] | None:
    """Which of `flat`, given as flat fields, sub-config `name` takes; None when the class rejects them."""
    from ..build import make_config

    try:
        rebuilt, _ = make_config({"model_type": base.get("model_type"), **flat}, num_labels=num_labels)
    except Exception:  # the class's own checks: not a usable probe
        return None
    sub = getattr(rebuilt, name, None)
    return [k for k, v in flat.items() if sub is not None and type(getattr(sub, k, None)) is type(v)
            and getattr(sub, k) == v]


def read_fields(config, base: dict[str, Any], num_labels: int | None, flat: dict[str, list[str]], *,
                template: bool = False) -> Fields:
    """The fields of `config` (the config object made from `base`), with the flat spellings `flat_spellings`
    found. In template mode, an integer field the config leaves out is moved to `unset`: the config class may
    derive it in ways no default says (DeepSeek-V3's head_dim is qk_rope_head_dim), so that varied alone it would
    disagree with itself; a config that sets it is built instead."""
    spellings = {path: list(others) for path, others in flat.items()}
    ints: dict[str, Field] = {}
    flags: list[Field] = []
    _walk(config, base, "", ints, flags, base, spellings)
    labels = labels_of(base, num_labels)
    ints["num_labels"] = Field("num_labels", labels, 2, "num_labels" in base or "id2label" in base)
    ints = dict(sorted(ints.items(), key=lambda item: rank(item[0])))
    unset: list[Field] = []
    if template:
        for path in [p for p, info in ints.items() if not info.present and p != "num_labels"]:
            unset.append(Field(path, None, ABSENT, False))
            del ints[path]
    return Fields(base=base, config_class=type(config), ints=ints, flags=tuple(flags), unset=tuple(unset),
                  spellings={path: tuple(others) for path, others in spellings.items()},
                  periodic=_find_periodic(ints, flags))


def _walk(config_obj, base: dict[str, Any], prefix: str, ints: dict[str, Field], flags: list[Field],
          root: dict[str, Any], spellings: dict[str, list[str]]) -> None:
    from transformers import PreTrainedConfig

    declared: dict[str, Any] = {}
    annotations: dict[str, str] = {}
    if dataclasses.is_dataclass(config_obj):
        for f in dataclasses.fields(config_obj):
            declared[f.name] = ABSENT if f.default is dataclasses.MISSING else f.default
            annotations[f.name] = str(f.type)
    # attributes the config object carries without declaring them (base-class defaults, __post_init__)
    try:
        effective = config_obj.to_dict()
    except Exception:  # broad on purpose: the config class's own code (remote code too) may raise anything
        effective = {}
    try:
        class_defaults = type(config_obj)().to_dict()
    except Exception:  # broad on purpose: a class whose defaults its own validation rejects, however it says so
        class_defaults = {}
    # transformers' attribute_map: an alias names the same field (Qwen3-MoE's num_experts is num_local_experts)
    alias_of = {alias: real for alias, real in (getattr(config_obj, "attribute_map", None) or {}).items()
                if isinstance(alias, str) and isinstance(real, str) and alias != real}
    for alias, real in alias_of.items():
        spellings.setdefault(prefix + real, []).append(prefix + alias)
    for alias, real in alias_of.items():  # a class may declare the alias as its field (Qwen3-MoE)
        if alias in declared and real not in declared:
            declared[real] = declared.pop(alias)
            annotations[real] = annotations.pop(alias, "")
    names = list(declared) + [k for k in base if k not in declared and k not in alias_of]
    names += [k for k in effective if k not in declared and k not in base and k not in alias_of]
    names += [real for alias, real in alias_of.items() if alias in base and real not in names]
    flat_copies = {spelling for others in spellings.values() for spelling in others
                   if "." not in spelling} if not prefix else set()
    for name in names:
        path = prefix + name
        if name.startswith("_") or name in _SKIP_KEYS or _SKIP_RE.search(name):
            continue
        sub = getattr(config_obj, name, None)
        if isinstance(sub, PreTrainedConfig):
            child = base.get(name) if isinstance(base.get(name), dict) else {}
            _walk(sub, child, path + ".", ints, flags, root, spellings)
            continue
        if name in flat_copies and name not in declared:
            continue  # a flat copy of a sub-config's field: catalogued there, under both spellings
        given = read_path(root, path, spellings)  # under any spelling, at any level
        present = given is not ABSENT
        if name in declared:
            default = declared[name]
        else:
            default = class_defaults.get(name, ABSENT)
        if present:
            value = given
        elif name in declared:
            value = default
        else:
            value = effective.get(name, ABSENT)
        if value is ABSENT:
            continue
        info = Field(path, value, default if _jsonable(default) else ABSENT, present, annotations.get(name, ""))
        if isinstance(value, int) and not isinstance(value, bool):
            ints[path] = info
        else:
            flags.append(info)


def _find_periodic(ints: dict[str, Field], flags: list[Field]) -> dict[str, tuple[str, list]]:
    """Lists as long as the layer count (layer_types, …): when the count varies, they repeat their period."""
    periodic: dict[str, tuple[str, list]] = {}
    for info in flags:
        value = info.value
        if not isinstance(value, list) or not value or any(isinstance(v, (list, dict)) for v in value):
            continue
        scope = info.path.rpartition(".")[0]
        same_length = [p for p, f in ints.items() if f.value == len(value) and p.rpartition(".")[0] == scope]
        layer_counts = [p for p in same_length if SYMBOL_OF_KEY.get(p.rsplit(".", 1)[-1], "").startswith("N")]
        chosen = (layer_counts or same_length)[:1]
        if chosen:
            periodic[info.path] = (chosen[0], _period(value))
    return periodic


def _period(values: list) -> list:
    for p in range(1, len(values) + 1):
        if all(values[i] == values[i % p] for i in range(len(values))):
            return values[:p]
    return values


def _jsonable(value: Any) -> bool:
    if value is ABSENT:
        return True
    try:
        json.dumps(value)
        return True
    except (TypeError, ValueError):
        return False
