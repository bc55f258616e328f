"""Closed-form parameter formulas, derived from the config for any model class, and checked.

How a formula is derived (nothing is fitted to one point):

1. Build the model on the meta device at the given config (the anchor) and group its parameters into
   families: names equal once layer/expert indices become `*` (`bert.encoder.layer.*.attention.self.query.weight`).
2. Sort the config's fields. Integer fields are candidate symbols. Every other field (booleans, strings,
   floats, null fields the config class derives, lists) is a candidate structural flag: all are changed at
   once and the model rebuilt; when its parameters change, the set is halved until each flag that matters is
   found. Those become assumptions (`tie_word_embeddings = true`, `n_inner is not set`). A field has one entry
   however it is spelled: attribute_map aliases (Qwen3-MoE's num_experts is num_local_experts) and the flat
   fields a sub-config is built from (Qwen2.5-VL's hidden_size is text_config.hidden_size) are its spellings,
   varied together.
3. Vary each integer field alone, twice, keeping divisibility relations (hidden size by heads) intact. A field
   that changes nothing is independent of the count (BERT's heads); one that adds or removes tensors is
   structural: it is tied to an equal field (ELECTRA's embedding_size = hidden_size) or held fixed.
   Fields that merely happen to be equal at the anchor (K = H in Llama-2, I = 4·D in BERT) are varied
   independently, so each keeps its own symbol.
4. Along each field, every multiplicity and every dimension is fitted as a·x^e + b (e in 1, −1, 2, …);
   the product of those exponent sets gives candidate monomials (K·D/H, N − N_dense, r_kv + d_rope), whose
   coefficients are solved exactly over all builds, including random joint variations. A dimension that no
   polynomial in the fields gives, but one in a whole-number quotient a // b does, gets a derived symbol
   (ViT's positions: Q² + 1 with Q = image_size // patch_size).
5. The formula (Σ multiplicity × Π dimensions) is checked against the meta count at every build, on two
   fresh hold-out builds, and per role at the anchor. Any disagreement raises FormulaMismatchError.

The result is cached on disk (formula_cache) and returned as a `Formula` whose `expression` is a sympy
expression.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import json
import random
import re
import time
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Callable

from . import progress
from .errors import ModelClassError, ParamscopeError
from .frozen import FrozenDict, freeze_fields
from .formula_cache import (
    ABSENT,
    AssumptionError,
    Condition,
    Family,
    FormulaError,
    FormulaMismatchError,
    FormulaSpec,
    Poly,
    factor_order,
    get_path,
    installed_transformers_version,
    labels_of,
    lookup,
    read_path,
    roles_fingerprint,
    route_key,
    set_path,
    store,
)

__all__ = ["Formula", "derive_formula", "formula_for", "AssumptionError", "FormulaError", "FormulaMismatchError"]

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
_SYMBOL_OF_KEY = {key: symbol for symbol, keys in KNOWN_SYMBOLS for key in keys}
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
_ACTIVATIONS = ("gelu", "relu", "silu", "gelu_new", "tanh")
_JUNK = "paramscope-probe"
_MAX_JOINT = 40


@dataclass
class _Field:
    path: str
    value: Any  # at the anchor: the config's value, else the class default
    default: Any  # the class default (ABSENT when the class declares none or derives it)
    present: bool
    annotation: str = ""


@dataclass(frozen=True)
class _Snapshot:
    fams: dict[tuple[str, str, int], tuple[int, tuple[int, ...]]]  # (pattern, role, k) → (multiplicity, shape)
    total: int
    breakdown: dict[str, int]
    # Template mode (template_record.py): the module skeleton with every size left out (class names, buffers,
    # ties, which runs of layers a stack holds), so that a field changing anything in the report is structural.
    skeleton: str = ""

    def structure(self) -> frozenset:
        return frozenset((key, len(shape)) for key, (_, shape) in self.fams.items()) | {("skeleton", self.skeleton)}

    def same(self, other: "_Snapshot") -> bool:
        return self.fams == other.fams and self.skeleton == other.skeleton


@dataclass(frozen=True)
class Formula:
    """A closed-form parameter count: `expression` (sympy) in the config's fields, checked against meta builds."""

    expression: Any  # sympy.Expr: the total
    by_role: FrozenDict[str, Any]  # role → sympy.Expr
    symbols: FrozenDict[str, str]  # symbol → config key (dotted for nested configs)
    value: int  # the count at this config
    assumptions: tuple[str, ...]
    values: FrozenDict[str, int]  # symbol → its value at this config
    spec: FormulaSpec = field(repr=False, compare=False)  # the stored spec (formula_cache): not in == or hash
    label: str = ""
    source: str = ""
    origin: str = "derived"  # "derived" here, or "cache"
    cache_path: str | None = None
    checked: int | None = None  # the meta-device count at this config, when one was built
    seconds: float = 0.0

    def __post_init__(self) -> None:
        freeze_fields(self, "by_role", "symbols", "values")

    @property
    def class_name(self) -> str:
        return self.spec.class_name

    def to_dict(self) -> dict[str, Any]:
        """The JSON `formula` object: expression (sympify-able), symbols, by_role, value, assumptions."""
        from .render.formula import formula_json

        return formula_json(self.spec, self.values, self.value)

    def evaluate(self, config: Any, *, num_labels: int | None = None) -> int:
        """The count at another config (a preset name, a path, a dict); AssumptionError if it breaks one."""
        return self.spec.value_at(_config_dict(config), num_labels)

    def shown(self):
        """What the renderers take (render.formula.Shown)."""
        from .render.formula import Shown

        return Shown(self.spec, self.values, self.label, self.source, self.origin, self.cache_path,
                     self.checked, self.seconds)

    def __repr__(self) -> str:
        from .render.formula import format_groups

        return (f"<Formula {self.class_name}: P = {format_groups(self.spec.total_groups(), self.spec.order)} "
                f"= {self.value:,}>")

    def _repr_latex_(self) -> str:  # Jupyter renders the formula as math
        from .render.formula import format_groups

        latex = format_groups(self.spec.total_groups(), self.spec.order, "latex")
        value = f"{self.value:,}".replace(",", "{,}")
        return f"$P = {latex} = {value}$"

    def subs(self, **values: Any):
        """The total with some symbols replaced, e.g. `formula.subs(I=4 * sympy.Symbol("D"))`."""
        import sympy

        return self.expression.subs({sympy.Symbol(k): v for k, v in values.items()})


def derive_formula(model: Any, *, model_class: str | None = None, task: str | None = None,
                   num_labels: int | None = None, use_cache: bool = True, revision: str | None = None) -> Formula:
    """The parameter count of `model` as a polynomial in its config's fields, verified against meta builds.

    `model` is anything `paramscope.inspect` takes except a live module: a preset name, a config.json path, a
    model directory, a hub id, a config dict or a PretrainedConfig. With `use_cache`, a formula derived
    before whose assumptions hold is reused (and checked here with one meta build); a new one is stored.
    """
    config, label, source = _resolve(model, revision)
    return formula_for(config, label=label, source=source, model_class=model_class, task=task,
                       num_labels=num_labels, use_cache=use_cache)


def formula_for(config: dict[str, Any], *, label: str, source: str, model_class: str | None = None,
                task: str | None = None, num_labels: int | None = None, use_cache: bool = True) -> Formula:
    """derive_formula for a config dict already read (the CLI's path after a cache miss)."""
    started = time.perf_counter()
    if use_cache:
        hit = lookup(config, model_class=model_class, task=task, num_labels=num_labels)
        if hit.spec is not None:
            checked = _check_at(hit.spec, config, hit.values, num_labels)
            return _make_formula(hit.spec, hit.values, label=label, source=source, origin="cache",
                                 cache_path=str(hit.path), checked=checked,
                                 seconds=time.perf_counter() - started)
    spec, values = _Deriver(config, label, model_class=model_class, task=task, num_labels=num_labels).run()
    path = None
    if use_cache:
        stored = store(spec, route=route_key(config, model_class=model_class, task=task))
        path = str(stored) if stored else None
    return _make_formula(spec, values, label=label, source=source, origin="derived", cache_path=path,
                         checked=spec.anchor["total"], seconds=time.perf_counter() - started)


def _make_formula(spec: FormulaSpec, values: dict[str, int], **info: Any) -> Formula:
    import sympy

    from .render.formula import assumption_texts

    evaluation = spec.evaluate(values)
    return Formula(
        expression=_groups_sympy(spec.total_groups(), sympy),
        by_role={role: _groups_sympy(groups, sympy) for role, groups in spec.role_groups().items()},
        symbols=dict(spec.symbols),
        value=evaluation.total,
        assumptions=tuple(assumption_texts(spec)),
        values=dict(values),
        spec=spec,
        **info,
    )


def _poly_sympy(poly: Poly, sympy) -> Any:
    terms = []
    for mono, coef in poly.terms.items():
        term = sympy.Rational(coef.numerator, coef.denominator)
        for name, e in mono:
            term = term * sympy.Symbol(name) ** e
        terms.append(term)
    return sympy.Add(*terms)


def _groups_sympy(groups, sympy) -> Any:
    """Σ multiplicity·(per-item sum); sympy keeps N·(D² + D) as written (it does not expand products)."""
    return sympy.Add(*(_poly_sympy(mult, sympy) * _poly_sympy(inner, sympy) for mult, inner in groups))


def _check_at(spec: FormulaSpec, config: dict[str, Any], values: dict[str, int], num_labels: int | None) -> int:
    """One meta build at `config`: the cached formula must give its count exactly, per role too."""
    counted = _build(config, spec.class_name, num_labels)
    evaluation = spec.evaluate(values)
    if evaluation.total != counted.counts.total or _nonzero(evaluation.by_role) != _nonzero(counted.breakdown):
        raise FormulaMismatchError(
            f"cached formula for {spec.class_name} gives {evaluation.total:,} but the meta build counts "
            f"{counted.counts.total:,}: a paramscope bug, please report it (rerun with use_cache=False to re-derive)"
        )
    return counted.counts.total


def _nonzero(mapping: dict[str, int]) -> dict[str, int]:
    return {k: v for k, v in mapping.items() if v}


# ---------------------------------------------------------------------------------------------------- inputs


def _resolve(model: Any, revision: str | None) -> tuple[dict[str, Any], str, str]:
    """(config dict, label, description) for what `paramscope.inspect` accepts, except a live module."""
    from .api import _is_module, as_source

    if _is_module(model):
        raise ModelClassError("a formula is derived from a config; a live module has no config fields to vary")
    source = as_source(model, revision)
    return copy.deepcopy(source.config), source.label, source.description


def _config_dict(config: Any) -> dict[str, Any]:
    return _resolve(config, None)[0]


def _build(config_dict: dict[str, Any], class_name: str, num_labels: int | None = None):
    """make_config → build_on_meta → count_module, quietly: the same path `paramscope inspect` takes."""
    from .count import count_module

    return count_module(build_module(config_dict, class_name, num_labels))


def build_module(config_dict: dict[str, Any], class_name: str, num_labels: int | None = None):
    """The meta-device module `_build` counts."""
    from .build import quiet_transformers, build_on_meta, make_config

    with quiet_transformers():
        config, _ = make_config(config_dict, num_labels=num_labels)
        return build_on_meta(class_name, config)


# ------------------------------------------------------------------------------------------------ derivation


def _family_pattern(name: str) -> str:
    """`bert.encoder.layer.3.attention.self.query.weight` → `bert.encoder.layer.*.attention.self.query.weight`."""
    return ".".join("*" if part.isdigit() else part for part in name.split("."))


def _snapshot(counted) -> _Snapshot:
    """Families keyed by (pattern, role, k): k tells apart shapes that share a pattern (rare, e.g. mixed layers)."""
    members: dict[tuple[str, str], list[tuple[int, ...]]] = {}
    for info in counted.parameters:
        members.setdefault((_family_pattern(info.name), info.role), []).append(info.shape)
    fams: dict[tuple[str, str, int], tuple[int, tuple[int, ...]]] = {}
    for (pattern, role), shapes in members.items():
        distinct: list[tuple[int, ...]] = []
        for shape in shapes:
            if shape not in distinct:
                distinct.append(shape)
        for k, shape in enumerate(distinct):
            fams[(pattern, role, k)] = (shapes.count(shape), shape)
    return _Snapshot(fams, counted.counts.total, dict(counted.breakdown))


class _Deriver:
    def __init__(self, config: dict[str, Any], label: str, *, model_class: str | None, task: str | None,
                 num_labels: int | None, take: Callable[[Any], _Snapshot] | None = None,
                 deadline: float | None = None, max_anchor_build_s: float | None = None):
        """`take` turns a built module into a snapshot (template mode; the default counts parameter families);
        past `deadline` (time.perf_counter()), or when the anchor's build alone takes over `max_anchor_build_s`,
        the derivation gives up with a FormulaError."""
        self.take = take
        self.deadline = deadline
        self.max_anchor_build_s = max_anchor_build_s
        # probe key → (the config built, its num_labels): template mode checks its report at them
        self.configs: dict[str, tuple[dict[str, Any], int | None]] = {}
        self.anchor_module: Any = None  # template mode: the module built at the anchor config
        self.base = copy.deepcopy(config)
        self.num_labels = num_labels
        self.label = label
        self.model_class = model_class
        self.task = task
        self.builds = 0
        self._probes: dict[str, _Snapshot | None] = {}
        self.periodic: dict[str, tuple[str, list]] = {}  # list path → (the int field its length follows, period)
        self.quotients: dict[str, tuple[str, str]] = {}  # "a//b" → (a, b): derived whole-number quotients

    # --- building ----------------------------------------------------------------------------------------------

    def probe(self, overrides: dict[str, Any]) -> _Snapshot | None:
        """The anchor config with `overrides` (path → value), built on meta; None when it cannot be built."""
        key = json.dumps(sorted(overrides.items()), default=str)
        if key in self._probes:
            return self._probes[key]
        config = copy.deepcopy(self.base)
        for path, value in overrides.items():
            if path != "num_labels":
                for spelling in self._spellings_in_base(path):
                    set_path(config, spelling, value)
            # per-layer lists (layer_types, …) follow the field that counts the layers
            for list_path, (length_path, period) in self.periodic.items():
                if length_path == path:
                    set_path(config, list_path, [period[i % len(period)] for i in range(value)])
        self.builds += 1
        if self.deadline is not None and time.perf_counter() > self.deadline:
            raise FormulaError(f"deriving {self.class_name}'s structure took longer than its time budget")
        progress.update(f"deriving {self.class_name}'s structure: probe build {self.builds} on meta")
        try:
            snap = self._take(config, overrides.get("num_labels", self.num_labels))
            self.configs[key] = (config, overrides.get("num_labels", self.num_labels))
        except ParamscopeError:
            snap = None
        except Exception:  # a config the class's own code rejects: not a usable probe
            snap = None
        self._probes[key] = snap
        return snap

    def _take(self, config: dict[str, Any], num_labels: int | None) -> _Snapshot:
        if self.take is None:
            return _snapshot(_build(config, self.class_name, num_labels))
        started = time.perf_counter()
        module = build_module(config, self.class_name, num_labels)
        if self.anchor_module is None:  # the first build is the anchor's
            self.anchor_module = module
            spent = time.perf_counter() - started
            if self.max_anchor_build_s is not None and spent > self.max_anchor_build_s:
                raise FormulaError(f"one build of {self.class_name} takes {spent:.1f} s here; deriving its structure "
                                   "would take 30–50 of them")
        return self.take(module)

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

    # --- the whole derivation ----------------------------------------------------------------------------------

    def run(self) -> tuple[FormulaSpec, dict[str, int]]:
        with progress.status(f"deriving {self.label}'s structure: builds on meta"):
            return self._run()

    def _run(self) -> tuple[FormulaSpec, dict[str, int]]:
        import transformers

        from .build import quiet_transformers, choose_class, make_config

        with quiet_transformers():
            config, _ = make_config(self.base, num_labels=self.num_labels)
            choice = choose_class(config, self.base, model_class=self.model_class, task=self.task)
            self.class_name = choice.name
            self.class_reason = choice.reason
            if getattr(transformers, self.class_name, None) is None:
                raise ModelClassError(f"formulas need a native transformers class; {self.class_name!r} is not one")
            self.spellings: dict[str, list[str]] = {}  # config path → its other spellings (aliases)
            self._register_flat_spellings(config)
            self.config_obj = config
        self.builds += 1
        self.anchor = self._take(self.base, self.num_labels)
        self._probes[json.dumps([])] = self.anchor
        self.configs[json.dumps([])] = (copy.deepcopy(self.base), self.num_labels)
        started = time.perf_counter()  # the derivation proper: the imports and the first build are any build's

        ints, flags = self._catalogue()
        unset: list[tuple[str, _Field]] = []
        if self.take is not None:
            # Template mode: a field the config leaves out may be one the config class derives in ways no default
            # says (DeepSeek-V3's head_dim is qk_rope_head_dim); varied alone, it would disagree with itself. The
            # class decides it, so the template assumes it stays unset: a config that sets it is built instead.
            for path in [p for p, info in ints.items() if not info.present and p != "num_labels"]:
                unset.append(("flag", _Field(path, None, ABSENT, False)))
                del ints[path]
        self._find_periodic(ints, flags)
        conditions = self._flag_conditions(flags) + unset
        groups, axis, independent, fixed = self._vary_ints(ints)
        conditions += fixed
        variables = [g for g in groups if g in axis]
        joint = self._joint(variables, axis, count=6)
        quantities = self._fit_all(variables, axis, joint)

        symbols, sym_of = self._symbols(variables, ints)
        derived: dict[str, tuple[str, str]] = {}
        for name, (a, b) in self.quotients.items():
            free = (f"Q{n}" if n > 1 else "Q" for n in itertools.count(1))
            symbol = next(q for q in free if q not in symbols and q not in derived)
            derived[symbol] = (sym_of[a], sym_of[b])
            sym_of[name] = symbol
        families = self._families(quantities, sym_of)
        # template mode: buffers and run lengths are fitted as families are, but are no parameters
        self.extra_families = tuple(f for f in families if f.role.startswith("<"))
        anchor_values = {sym_of[v]: ints[v].value for v in variables}
        anchor_values.update({symbol: anchor_values[a] // anchor_values[b] for symbol, (a, b) in derived.items()})
        spec_conditions = self._conditions(conditions, groups, ints, variables, sym_of, families)
        defaults = {}
        for path, info in ints.items():
            if isinstance(info.default, int) and not isinstance(info.default, bool):
                defaults[path] = info.default
        spec = FormulaSpec(
            class_name=self.class_name,
            model_type=str(self.base.get("model_type")),
            transformers_version=installed_transformers_version() or transformers.__version__,
            roles_fingerprint=roles_fingerprint(),
            symbols=symbols,
            defaults=defaults,
            families=tuple(f for f in families if not f.role.startswith("<")),
            conditions=spec_conditions,
            independent=tuple(sorted((p for p in independent if ints[p].present or p != "num_labels"),
                                     key=self._rank)),
            sympy_names=_sympy_names({**symbols, **derived}),
            anchor={},
            aliases={path: tuple(others) for path, others in self.spellings.items()},
            derived=derived,
        )
        self._verify(spec, variables, sym_of, axis, joint)
        # two fresh joint builds the fit never saw
        holdout = self._joint(variables, axis, count=2, seed=1, exclude=joint)
        self._verify(spec, variables, sym_of, axis, holdout, holdout=True)
        anchor = {"label": self.label, "values": anchor_values, "total": self.anchor.total,
                  "by_role": _nonzero(self.anchor.breakdown), "builds": self.builds,
                  "seconds": round(time.perf_counter() - started, 3)}
        spec = dataclasses.replace(spec, anchor=anchor)
        return spec, anchor_values

    # --- 2. the config's fields --------------------------------------------------------------------------------

    def _catalogue(self) -> tuple[dict[str, _Field], list[_Field]]:
        ints: dict[str, _Field] = {}
        flags: list[_Field] = []
        self._walk(self.config_obj, self.base, "", ints, flags)
        labels = labels_of(self.base, self.num_labels)
        ints["num_labels"] = _Field("num_labels", labels, 2, "num_labels" in self.base or "id2label" in self.base)
        self._ints = dict(sorted(ints.items(), key=lambda item: self._rank(item[0])))
        return self._ints, flags

    def _register_flat_spellings(self, config) -> None:
        """Sub-configs some classes build from flat fields when the sub-config is not given (Qwen2.5-VL's
        text_config from hidden_size, …): such a field is one field with two spellings, `text_config.hidden_size`,
        read when text_config is given, and `hidden_size`, read when it is not.

        A sub-config most of whose probed fields come from flat fields is built from them: all its fields get
        both spellings (the class passes them on together). Otherwise only the fields seen coming from a flat
        field do (Qwen2.5-VL forwards tokens_per_second alone to its vision config).
        """
        from transformers import PreTrainedConfig

        top_level = {f.name for f in dataclasses.fields(config)} if dataclasses.is_dataclass(config) else set()
        claimed = {s for spellings in self.spellings.values() for s in spellings}
        for name, sub in list(vars(config).items()):
            if not isinstance(sub, PreTrainedConfig) or not dataclasses.is_dataclass(sub):
                continue
            fed, probed = self._flat_fed(name, sub, top_level)
            if not fed:
                continue
            fields = [f.name for f in dataclasses.fields(sub)] if 2 * len(fed) > probed else fed
            for field_name in fields:
                if field_name.startswith("_") or field_name in top_level or field_name in claimed:
                    continue
                self.spellings.setdefault(f"{name}.{field_name}", []).append(field_name)
                claimed.add(field_name)

    def _flat_fed(self, name: str, sub, top_level: set[str]) -> tuple[list[str], int]:
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
        found = self._read_back(name, changed)
        if found is None:
            found = [k for k, v in changed.items() if self._read_back(name, {k: v})]
        return found, len(changed)

    def _read_back(self, name: str, flat: dict[str, Any]) -> list[str] | None:
        """Which of `flat`, given as flat fields, sub-config `name` takes; None when the class rejects them."""
        from .build import make_config

        try:
            rebuilt, _ = make_config({"model_type": self.base.get("model_type"), **flat}, num_labels=self.num_labels)
        except Exception:  # the class's own checks: not a usable probe
            return None
        sub = getattr(rebuilt, name, None)
        return [k for k, v in flat.items() if sub is not None and type(getattr(sub, k, None)) is type(v)
                and getattr(sub, k) == v]

    def _walk(self, config_obj, base: dict[str, Any], prefix: str, ints, flags) -> None:
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
            self.spellings.setdefault(prefix + real, []).append(prefix + alias)
        for alias, real in alias_of.items():  # a class may declare the alias as its field (Qwen3-MoE)
            if alias in declared and real not in declared:
                declared[real] = declared.pop(alias)
                annotations[real] = annotations.pop(alias, "")
        names = list(declared) + [k for k in base if k not in declared and k not in alias_of]
        names += [k for k in effective if k not in declared and k not in base and k not in alias_of]
        names += [real for alias, real in alias_of.items() if alias in base and real not in names]
        flat_copies = {spelling for spellings in self.spellings.values() for spelling in spellings
                       if "." not in spelling} if not prefix else set()
        for name in names:
            path = prefix + name
            if name.startswith("_") or name in _SKIP_KEYS or _SKIP_RE.search(name):
                continue
            sub = getattr(config_obj, name, None)
            if isinstance(sub, PreTrainedConfig):
                child = base.get(name) if isinstance(base.get(name), dict) else {}
                self._walk(sub, child, path + ".", ints, flags)
                continue
            if name in flat_copies and name not in declared:
                continue  # a flat copy of a sub-config's field: catalogued there, under both spellings
            given = read_path(self.base, path, self.spellings)  # under any spelling, at any level
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
            info = _Field(path, value, default if _jsonable(default) else ABSENT, present, annotations.get(name, ""))
            if isinstance(value, int) and not isinstance(value, bool):
                ints[path] = info
            else:
                flags.append(info)

    def _find_periodic(self, ints: dict[str, _Field], flags: list[_Field]) -> None:
        """Lists as long as the layer count (layer_types, …): when the count varies, they repeat their period."""
        for info in flags:
            value = info.value
            if not isinstance(value, list) or not value or any(isinstance(v, (list, dict)) for v in value):
                continue
            scope = info.path.rpartition(".")[0]
            same_length = [p for p, f in ints.items() if f.value == len(value) and p.rpartition(".")[0] == scope]
            layer_counts = [p for p in same_length if _SYMBOL_OF_KEY.get(p.rsplit(".", 1)[-1], "").startswith("N")]
            chosen = (layer_counts or same_length)[:1]
            if chosen:
                self.periodic[info.path] = (chosen[0], _period(value))

    def _rank(self, path: str) -> tuple[int, int, str]:
        """Nested fields last; known keys in the notes' order (V, D, L, N, I, T, H, K, E, …); then by name."""
        leaf = path.rsplit(".", 1)[-1]
        return (path.count("."), _KEY_RANK.get(leaf, len(_KEY_RANK)), path)

    # --- 3. structural flags, by group testing ----------------------------------------------------------------

    def _alternatives(self, info: _Field) -> list[Any]:
        value = info.value
        if isinstance(value, bool):
            return [not value]
        if isinstance(value, float):
            return [value * 2 if value else 0.5, value + 1.0]
        if isinstance(value, str):
            leaf = info.path.rsplit(".", 1)[-1]
            if "act" in leaf:
                return [a for a in _ACTIVATIONS if a != value][:2]
            return [_JUNK]
        if value is None:
            if "int" in info.annotation or not info.annotation:
                return [2, 1, 4]
            if "float" in info.annotation:
                return [0.5]
            if "bool" in info.annotation:
                return [True]
            if "str" in info.annotation and "list" not in info.annotation and "dict" not in info.annotation:
                return [_JUNK]
            return []
        return []  # lists and dicts: held as they are (structural)

    def _flag_conditions(self, flags: list[_Field]) -> list[tuple[str, _Field]]:
        structural: list[_Field] = []
        testable = []
        for info in flags:
            if self._alternatives(info):
                testable.append(info)
            else:
                structural.append(info)

        def unchanged(group: list[_Field], pick: int = 0) -> bool:
            overrides = {}
            for info in group:
                alts = self._alternatives(info)
                overrides[info.path] = alts[min(pick, len(alts) - 1)]
            snap = self.probe(overrides)
            return snap is not None and snap.same(self.anchor)

        def split(group: list[_Field]) -> None:
            if not group or unchanged(group):
                return
            if len(group) == 1:
                info = group[0]
                if not any(unchanged(group, pick) for pick in range(1, len(self._alternatives(info)))):
                    structural.append(info)
                return
            half = len(group) // 2
            split(group[:half])
            split(group[half:])

        split(testable)
        order = {info.path: i for i, info in enumerate(flags)}
        return [("flag", info) for info in sorted(structural, key=lambda f: order[f.path])]

    # --- 3. integer fields, one at a time --------------------------------------------------------------------

    def _candidates(self, path: str, value: int, ints: dict[str, _Field]) -> list[int]:
        if value <= 0:
            raw = [1, 2, 3, 4]
        elif value == 1:
            raw = [2, 3, 4, 5]
        else:
            raw = [value // 2 if value % 2 == 0 else None, value * 2, value // 3 if value % 3 == 0 else None,
                   value * 3, value + 1, value - 1, value * 4, value + 2, value - 2, value * 5]
            if _SYMBOL_OF_KEY.get(path.rsplit(".", 1)[-1]) == "K":
                # key/value heads must divide the query heads, and builds refuse any other count: at K = H = 32
                # (Llama-2-7B) only 16, 8 and 4 let K move alone
                raw[2:2] = [value // d for d in (4, 8) if value % d == 0]
        seen, out = set(), []
        for x in raw:
            if x is not None and x >= 1 and x != value and x not in seen:
                seen.add(x)
                out.append(x)
        if value <= 0:
            return out
        # prefer values that keep the anchor's divisibility relations (hidden size by heads, …) intact
        others = [f.value for p, f in ints.items() if p != path and f.value >= 2 and f.value != value]

        def breaks(x: int) -> int:
            n = 0
            for w in others:
                if w % value == 0 and w % x:
                    n += 1
                if value % w == 0 and x % w:
                    n += 1
            return n

        return sorted(out, key=breaks)

    def _vary_ints(self, ints: dict[str, _Field]):
        """Which integer fields matter, and two more values along each that keep the model's structure."""
        groups: dict[str, list[str]] = {path: [path] for path in ints}  # representative → members moved with it
        axis: dict[str, list[tuple[int, _Snapshot]]] = {}
        independent: list[str] = []
        fixed: list[tuple[str, _Field]] = []
        self.groups = groups
        # fields with no conventional symbol rarely matter (ep_size, n_group, pooler leftovers): screen them
        # together first, one build for all when none changes a parameter
        suspects = [p for p in ints if p == "num_labels" or p.rsplit(".", 1)[-1] not in _SYMBOL_OF_KEY]
        screened = self._screen(groups, suspects, ints)
        for path in list(ints):
            if path not in groups:  # already moved with an equal field
                continue
            if path in screened:
                independent.append(path)
                continue
            verdict, found = self._axis(groups, path, ints)
            if verdict == "independent":
                independent.append(path)
            elif verdict == "varies":
                axis[path] = found
            elif not self._link(groups, path, ints, axis):
                # the tensors themselves change with this field, or it cannot be varied: hold it fixed
                fixed.append(("fixed", ints[path]))
        return groups, axis, independent, fixed

    def _screen(self, groups, paths: list[str], ints) -> set[str]:
        """The fields among `paths` that change no parameter, found by moving many at once and halving."""
        independent: set[str] = set()

        def split(batch: list[str]) -> None:
            if len(batch) < 2:
                return  # a single field is probed on its own (the same first build, so it is reused)
            overrides: dict[str, int] = {}
            for path in batch:
                overrides.update(self._assign(groups, path, self._candidates(path, ints[path].value, ints)[0]))
            snap = self.probe(overrides)
            if snap is not None and snap.same(self.anchor):
                independent.update(batch)
                return
            half = len(batch) // 2
            split(batch[:half])
            split(batch[half:])

        split(paths)
        return independent

    def _axis(self, groups, rep: str, ints) -> tuple[str, list[tuple[int, _Snapshot]]]:
        anchor_structure = self.anchor.structure()
        found: list[tuple[int, _Snapshot]] = []
        for x in self._candidates(rep, ints[rep].value, ints)[:8]:
            snap = self.probe(self._assign(groups, rep, x))
            if snap is None or snap.structure() != anchor_structure:
                continue
            if snap.same(self.anchor):
                return "independent", []
            found.append((x, snap))
            if len(found) == 2:
                return "varies", found
        return "stuck", found

    def _link(self, groups, path: str, ints, axis) -> bool:
        """Tie `path` to an equal field when moving both together keeps the structure (embedding = hidden)."""
        value = ints[path].value
        for other in list(groups):
            if other == path or ints[other].value != value:
                continue
            rep, member = (other, path) if self._rank(other) <= self._rank(path) else (path, other)
            trial = {r: list(m) for r, m in groups.items()}
            trial[rep] = trial[rep] + trial.pop(member)
            verdict, found = self._axis(trial, rep, ints)
            if verdict == "varies":
                groups.clear()
                groups.update(trial)
                axis.pop(member, None)
                axis[rep] = found
                return True
        return False

    @staticmethod
    def _assign(groups: dict[str, list[str]], rep: str, x: int) -> dict[str, int]:
        return {member: x for member in groups.get(rep, [rep])}

    def _overrides(self, assignment: dict[str, int]) -> dict[str, int]:
        out: dict[str, int] = {}
        for rep, x in assignment.items():
            out.update(self._assign(self.groups, rep, x))
        return out

    def _joint(self, variables: list[str], axis, *, count: int, seed: int = 0, exclude=()) -> list:
        """Random joint variations of all the fields that matter: they separate products from sums."""
        if len(variables) < 2:
            return []
        rng = random.Random(seed)
        anchor_structure = self.anchor.structure()
        seen = {json.dumps(sorted(a.items())) for a, _ in exclude}
        out = []
        for _ in range(count * 6):
            if len(out) >= count:
                break
            assignment = {}
            for rep in variables:
                values = [self.values0[rep]] + [x for x, _ in axis[rep]]
                assignment[rep] = rng.choice(values)
            moved = sum(assignment[rep] != self.values0[rep] for rep in variables)
            key = json.dumps(sorted(assignment.items()))
            if moved < 2 or key in seen:
                continue
            seen.add(key)
            snap = self.probe(self._overrides(assignment))
            if snap is not None and snap.structure() == anchor_structure:
                out.append((assignment, snap))
        return out

    # --- 4. fitting -------------------------------------------------------------------------------------------

    def _observations(self, variables, axis, joint) -> list[tuple[dict[str, int], _Snapshot]]:
        obs = [(dict(self.values0), self.anchor)]
        for rep in variables:
            for x, snap in axis[rep]:
                obs.append(({**self.values0, rep: x}, snap))
        obs.extend(({**self.values0, **assignment}, snap) for assignment, snap in joint)
        return obs

    def _fit_all(self, variables, axis, joint):
        fitted = None
        for _ in range(8):
            obs = self._observations(variables, axis, joint)
            fitted, short = {}, False
            for key, (_, shape) in self.anchor.fams.items():
                comps = []
                for i in range(len(shape) + 1):
                    poly = self._fit(key, i, variables, axis, obs)
                    if poly is None:
                        short = True
                        break
                    comps.append(poly)
                if short:
                    break
                fitted[key] = comps
            if not short:
                return fitted
            if len(joint) >= _MAX_JOINT:
                break
            joint.extend(self._joint(variables, axis, count=6, seed=len(joint) + 7, exclude=joint))
        raise FormulaError(f"not enough independent builds to separate the terms of {self.class_name}'s formula")

    @staticmethod
    def _quantity(snap: _Snapshot, key, i: int) -> int | None:
        entry = snap.fams.get(key)
        if entry is None:
            return None
        return entry[0] if i == 0 else entry[1][i - 1]

    def _fit(self, key, i: int, variables, axis, obs) -> Poly | None:
        """One multiplicity (i = 0) or dimension as an exact Laurent polynomial; None: needs more builds."""
        y0 = self._quantity(self.anchor, key, i)
        exponents: dict[str, tuple[int, ...]] = {}
        for rep in variables:
            points = [(self.values0[rep], y0)] + [(x, self._quantity(snap, key, i)) for x, snap in axis[rep]]
            if all(y == y0 for _, y in points):
                continue
            exponents[rep] = self._axis_exponents(key, i, rep, points)
        monomials = [dict(zip(exponents, combo)) for combo in itertools.product(*exponents.values())]
        rows, rhs = [], []
        for assignment, snap in obs:
            y = self._quantity(snap, key, i)
            if y is None:
                continue
            rows.append([_monomial_value(m, assignment) for m in monomials])
            rhs.append(Fraction(y))
        solution = _solve(rows, rhs)
        if solution is None:
            quotient = self._fit_quotient(key, i, exponents, obs)
            if quotient is not None:
                return quotient
            raise FormulaError(
                f"{key[0]}: its {'count' if i == 0 else f'dimension {i - 1}'} is no polynomial in the config's "
                f"fields that paramscope can find, so no closed form is given for {self.class_name}"
            )
        if solution == "underdetermined":
            return None
        poly = Poly()
        for mono, coef in zip(monomials, solution):
            if coef:
                poly = poly + Poly.monomial(mono, coef)
        return poly

    def _fit_quotient(self, key, i: int, exponents: dict[str, tuple[int, ...]], obs) -> Poly | None:
        """The quantity as a polynomial in a whole-number quotient a // b, where it grows as a^e and shrinks as
        b^−e: ViT's positions are (image_size // patch_size)² + 1, which no polynomial in the two fields gives
        once image_size is no multiple of patch_size. None when no such quotient gives one."""
        for a, b in itertools.permutations(exponents, 2):
            powers = sorted({e for e in exponents[a] if e > 0 and -e in exponents[b]})
            if not powers:
                continue
            name = f"{a}//{b}"
            rest = {rep: exps for rep, exps in exponents.items() if rep not in (a, b)}
            rest[name] = tuple(powers) + (0,)
            monomials = [dict(zip(rest, combo)) for combo in itertools.product(*rest.values())]
            rows, rhs = [], []
            for assignment, snap in obs:
                y = self._quantity(snap, key, i)
                if y is None or assignment[a] < assignment[b]:
                    continue
                point = {**assignment, name: assignment[a] // assignment[b]}
                rows.append([_monomial_value(m, point) for m in monomials])
                rhs.append(Fraction(y))
            solution = _solve(rows, rhs)
            if solution is None or solution == "underdetermined":
                continue
            self.quotients[name] = (a, b)
            poly = Poly()
            for mono, coef in zip(monomials, solution):
                if coef:
                    poly = poly + Poly.monomial(mono, coef)
            return poly
        return None

    def _axis_exponents(self, key, i: int, rep: str, points) -> tuple[int, ...]:
        (x0, y0), (x1, y1), (x2, y2) = points[:3]
        for e in (1, -1, 2, -2, 3):
            X = [Fraction(x) ** e for x in (x0, x1, x2)]
            if X[1] == X[0]:
                continue
            a = Fraction(y1 - y0) / (X[1] - X[0])
            b = y0 - a * X[0]
            if a * X[2] + b == y2:
                return (e,) if b == 0 else (e, 0)
        raise FormulaError(
            f"{key[0]}: its {'count' if i == 0 else f'dimension {i - 1}'} varies with {rep} in no way a "
            f"polynomial can express ({', '.join(f'{x} → {y}' for x, y in points)}), so no closed form is given "
            f"for {self.class_name}"
        )

    # --- symbols, families, conditions ------------------------------------------------------------------------

    @property
    def values0(self) -> dict[str, int]:
        if not hasattr(self, "_values0"):
            self._values0 = {rep: self._ints[rep].value for rep in self.groups}
        return self._values0

    def _symbols(self, variables: list[str], ints) -> tuple[dict[str, str], dict[str, str]]:
        symbols: dict[str, str] = {}
        sym_of: dict[str, str] = {}
        for path in sorted(variables, key=self._rank):
            leaf = path.rsplit(".", 1)[-1]
            prefix = path.rsplit(".", 1)[0].split("_")[0] if "." in path else ""
            # an alias may carry the conventional name (a vision tower's depth is its num_hidden_layers)
            known = [_SYMBOL_OF_KEY[k] for k in [leaf] + [a.rsplit(".", 1)[-1] for a in self.spellings.get(path, ())]
                     if k in _SYMBOL_OF_KEY]
            base = known[0] if known else re.sub(r"\W", "_", leaf)
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

        def rank(s: str) -> tuple[int, int]:
            head = s if s in known else s.rsplit("_", 1)[0]
            return (known.index(head) if head in known else len(known), arrival.index(s))

        ordered = sorted(symbols, key=rank)
        return {s: symbols[s] for s in ordered}, sym_of

    def _families(self, quantities, sym_of) -> tuple[Family, ...]:
        families = []
        for key, comps in quantities.items():
            renamed = [_rename(poly, sym_of) for poly in comps]
            families.append(Family(key[0], key[1], renamed[0], tuple(renamed[1:])))
        return tuple(families)

    def _conditions(self, raw, groups, ints, variables, sym_of, families) -> tuple[Condition, ...]:
        from .render.formula import format_poly

        out: list[Condition] = []
        for kind, info in raw:
            default = info.default
            if kind == "fixed":
                text = f"{info.path} = {info.value} (the set of tensors changes with it)"
                out.append(Condition("equals", info.path, info.value, default, text))
            elif info.value is None:
                out.append(Condition("unset", info.path, None, default,
                                     f"{info.path} is not set (the config class derives it)"))
            elif info.path in self.periodic:
                length_path, period = self.periodic[info.path]
                out.append(Condition("periodic", info.path, period, default,
                                     f"{info.path} repeats {json.dumps(period)} over the {length_path} layers"))
            else:
                out.append(Condition("equals", info.path, info.value, default,
                                     f"{info.path} = {json.dumps(info.value)}"))
        for rep, members in groups.items():
            for member in members[1:]:
                out.append(Condition("same_as", member, rep, ints[member].default,
                                     f"{member} = {rep} (the set of tensors changes when they differ)"))
        for path in variables:
            info = ints[path]
            if not isinstance(info.default, int) or isinstance(info.default, bool):
                if path != "num_labels":
                    out.append(Condition("present", path, None, ABSENT,
                                         f"{path} is given (left unset, the config class derives it)"))
        order = factor_order(sym_of[v] for v in variables)
        seen = set()
        for fam in families:
            for dim in (fam.mult, *fam.shape):
                if dim.has_denominator():
                    text = format_poly(dim, order)
                    if text not in seen:
                        seen.add(text)
                        out.append(Condition("integral", "", dim.to_json(), None, f"{text} is a whole number"))
        return tuple(out)

    # --- 5. verification --------------------------------------------------------------------------------------

    def _verify(self, spec: FormulaSpec, variables, sym_of, axis, joint, holdout: bool = False) -> None:
        observations = self._observations(variables, axis, joint) if not holdout else [
            ({**self.values0, **a}, s) for a, s in joint]
        for assignment, snap in observations:
            values = {sym_of[rep]: assignment[rep] for rep in variables}
            evaluation = spec.evaluate(values)
            if evaluation.total != snap.total:
                where = ", ".join(f"{rep}={assignment[rep]}" for rep in variables if assignment[rep] != self.values0[rep])
                raise FormulaMismatchError(
                    f"the derived formula for {self.class_name} gives {evaluation.total:,} but the meta build counts "
                    f"{snap.total:,} at {where or 'the given config'}"
                    f"{' (a hold-out build)' if holdout else ''}: a paramscope bug, please report it"
                )
        values = {sym_of[rep]: self.values0[rep] for rep in variables}
        by_role = spec.evaluate(values).by_role
        if _nonzero(by_role) != _nonzero(self.anchor.breakdown):
            raise FormulaMismatchError(
                f"the derived formula's split by role for {self.class_name} disagrees with the meta count: "
                "a paramscope bug, please report it"
            )


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


def _rename(poly: Poly, sym_of: dict[str, str]) -> Poly:
    return Poly((tuple((sym_of[name], e) for name, e in mono), coef) for mono, coef in poly.terms.items())


def _monomial_value(mono: dict[str, int], assignment: dict[str, int]) -> Fraction:
    value = Fraction(1)
    for rep, e in mono.items():
        value *= Fraction(assignment[rep]) ** e
    return value


def _solve(rows: list[list[Fraction]], rhs: list[Fraction]):
    """Exact least-structure solve: the unique solution, None if inconsistent, 'underdetermined' if not unique."""
    if not rows:
        return "underdetermined"
    ncols = len(rows[0])
    matrix = [list(row) + [b] for row, b in zip(rows, rhs)]
    pivots = []
    r = 0
    for c in range(ncols):
        pivot = next((i for i in range(r, len(matrix)) if matrix[i][c] != 0), None)
        if pivot is None:
            continue
        matrix[r], matrix[pivot] = matrix[pivot], matrix[r]
        lead = matrix[r][c]
        matrix[r] = [v / lead for v in matrix[r]]
        for i in range(len(matrix)):
            if i != r and matrix[i][c] != 0:
                factor = matrix[i][c]
                matrix[i] = [a - factor * b for a, b in zip(matrix[i], matrix[r])]
        pivots.append(c)
        r += 1
        if r == len(matrix):
            break
    for i in range(r, len(matrix)):
        if matrix[i][ncols] != 0:
            return None
    if len(pivots) < ncols:
        return "underdetermined"
    solution = [Fraction(0)] * ncols
    for i, c in enumerate(pivots):
        solution[c] = matrix[i][ncols]
    return solution


def _sympy_names(symbols: dict[str, str]) -> dict[str, str]:
    """How each symbol must be written so that plain `sympy.sympify` reads it as that symbol (N, I, E, S, …)."""
    import sympy

    out = {}
    for name in symbols:
        try:
            ok = sympy.sympify(name) == sympy.Symbol(name)
        except sympy.SympifyError:  # a Python keyword (lambda, if, …): sympify cannot read it as a name
            ok = False
        out[name] = name if ok else f"Symbol('{name}')"
    return out
