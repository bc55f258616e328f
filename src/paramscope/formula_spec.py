"""Parameter formulas as data: a class's count as polynomials in its config's fields, the conditions under which
they hold, and their evaluation at a config with the standard library alone.

A derived formula is a `FormulaSpec`: for each tensor family (a parameter name with its layer and expert indices
replaced by `*`) its multiplicity and its shape, each a polynomial (polynomial.py) in the config's integer fields,
plus the conditions (structural flags, derived fields, equalities) under which those polynomials hold, the class
defaults of the fields a config may leave out, and the anchor: the count, total and per role, of the config it was
derived from. Evaluating a spec at a config is plain integer arithmetic on that data.

`from_json` type-checks and bounds every field (CacheEntryError names what is wrong) before any arithmetic, so a
spec read from the disk cache (formula_cache.py, template.py) is cheap to evaluate and cannot fail. Configs are read
by dotted path (`read_path`) the way transformers reads them, under every spelling of a field.
"""

from __future__ import annotations

import functools
import hashlib
import json
import keyword
import re
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Iterable

from .disk_cache import expect, is_int
# The formula errors live in errors.py; formula.py and the formula modules import them from here too.
from .errors import AssumptionError, ConfigError, FormulaError, FormulaMismatchError  # noqa: F401
from .polynomial import MAX_COEFFICIENT, Poly, product

FORMAT = 2  # 2: the anchor carries its per-role counts, and every entry is checked against its anchor
# Factors inside a term follow this order (multiplicities first, the width D late, divisors last).
FACTOR_ORDER = ("N", "N_dec", "N_dense", "G", "G_in", "E", "E_sh", "V", "L", "T", "C", "B", "K", "D", "D_emb",
                "I", "I_dec", "I_moe", "I_sh", "H", "H_dec", "d_h", "r_q", "r_kv", "d_nope", "d_rope", "d_v", "d_rot")
ABSENT = "<absent>"  # JSON marker: the key is not in the config and the config class declares no default
_CONDITION_KINDS = frozenset({"equals", "unset", "same_as", "present", "integral", "periodic"})

# Names that reach `formula --json`'s expression strings, which users pass to sympy.sympify (an eval): a symbol is a
# plain identifier of at most 64 characters, never a Python keyword nor a dunder (__import__, __class__), so that a
# string built from symbols, numbers and + - * / ** ( ) can only ever parse to symbols and numbers. A config path
# is such identifiers joined by dots. A cache entry is checked against these when it is read, and every name again
# where an expression string is made (`sympy_spelling`): nothing from a cache reaches an expression unchecked.
MAX_SYMBOL_LENGTH = 64
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
MAX_PATH_PARTS = 8  # text_config.…: configs nest one or two levels
# The conventional symbols that plain sympify reads as themselves; all but N (sympy's N()), I (the imaginary unit)
# and E (Euler's number). Every other name is written Symbol('name'), which sympify reads as that symbol whatever
# sympy itself calls the name (Q, S, beta, …). tests/test_formula_cache_hostile.py checks this set against sympy.
PLAIN_SYMPY_NAMES = frozenset(FACTOR_ORDER) - {"N", "I", "E"}


def symbol_problem(name: object) -> str | None:
    """Why `name` may not be a formula symbol, or None when it may."""
    if not isinstance(name, str) or not 0 < len(name) <= MAX_SYMBOL_LENGTH or not _IDENTIFIER.fullmatch(name):
        return (f"the symbol name {str(name)[:40]!r} is not an identifier of at most {MAX_SYMBOL_LENGTH} "
                "characters")
    if keyword.iskeyword(name) or name.startswith("__"):
        return f"the symbol name {name!r} is a Python keyword or a dunder"
    return None


def path_problem(path: object) -> str | None:
    """Why `path` may not be a config field's dotted path in a formula, or None when it may."""
    parts = path.split(".") if isinstance(path, str) else []
    if not 0 < len(parts) <= MAX_PATH_PARTS or any(symbol_problem(part) for part in parts):
        return (f"the config path {str(path)[:40]!r} is not at most {MAX_PATH_PARTS} identifiers of at most "
                f"{MAX_SYMBOL_LENGTH} characters (no keyword, no dunder) joined by dots")
    return None


def sympy_spelling(name: str) -> str:
    """How a sympify-able string writes symbol `name`: bare when plain sympify reads it as that symbol, else
    Symbol('name'). Checked here, where expression strings are made, whatever was checked before: FormulaError
    for a name that is not a safe identifier."""
    problem = symbol_problem(name)
    if problem:
        raise FormulaError(f"refusing to write a formula expression: {problem}")
    return name if name in PLAIN_SYMPY_NAMES else f"Symbol('{name}')"


def _check_sympy_names(data: Any, names: Iterable[str]) -> dict[str, str]:
    """The stored sympy_names, checked: one per symbol, each the bare name or Symbol('name'). They are kept for the
    cache format only (derivation writes what sympy says, so shipped templates stay byte-stable); expressions are
    written with `sympy_spelling`, never with what an entry says."""
    names = list(names)
    sympy_names = _str_dict(data, "sympy_names")
    expect(set(sympy_names) == set(names), "sympy_names does not name exactly the symbols")
    expect(all(spelling in (name, f"Symbol('{name}')") for name, spelling in sympy_names.items()),
           "a sympy name is neither the symbol nor Symbol('symbol')")
    return sympy_names


def _str_dict(data: Any, what: str, values=str) -> dict:
    expect(isinstance(data, dict) and all(isinstance(k, str) and isinstance(v, values) and not isinstance(v, bool)
                                          for k, v in data.items()), f"{what} is not a mapping of the right types")
    return dict(data)


# ---------------------------------------------------------------------------------------------------- the spec


@dataclass(frozen=True)
class Family:
    """Tensors that differ only by layer/expert index: `mult` of them, each of shape `shape`."""

    pattern: str
    role: str
    mult: Poly
    shape: tuple[Poly, ...]

    def numel(self) -> Poly:
        return self.mult * product(self.shape)

    def per_item(self) -> Poly:
        return product(self.shape)

    def to_json(self) -> dict:
        return {"pattern": self.pattern, "role": self.role, "mult": self.mult.to_json(),
                "shape": [d.to_json() for d in self.shape]}

    @classmethod
    def from_json(cls, data: Any, symbols: Iterable[str] | None = None) -> "Family":
        expect(isinstance(data, dict) and isinstance(data.get("pattern"), str) and isinstance(data.get("role"), str)
               and isinstance(data.get("shape"), list), "a family is not {pattern, role, mult, shape}")
        return cls(data["pattern"], data["role"], Poly.from_json(data.get("mult"), symbols),
                   tuple(Poly.from_json(d, symbols) for d in data["shape"]))


@dataclass(frozen=True)
class Condition:
    """One assumption. kind: equals (a structural flag keeps its value), unset (a field the config class derives
    stays unset), same_as (two fields stay equal), present (a symbol's field must be given), integral (a
    dimension with a denominator must come out whole)."""

    kind: str
    path: str
    value: Any
    default: Any
    text: str

    def to_json(self) -> dict:
        return {"kind": self.kind, "path": self.path, "value": self.value, "default": self.default, "text": self.text}

    @classmethod
    def from_json(cls, data: Any) -> "Condition":
        expect(isinstance(data, dict) and {"kind", "path", "value", "default", "text"} <= set(data)
               and isinstance(data["kind"], str) and data["kind"] in _CONDITION_KINDS and isinstance(data["path"], str)
               and isinstance(data["text"], str), "a condition is not {kind, path, value, default, text}")
        expect(data["kind"] != "same_as" or isinstance(data["value"], str), "a same_as condition names no field")
        expect(data["kind"] != "periodic" or isinstance(data["value"], list) and data["value"],
               "a periodic condition has no period")
        return cls(data["kind"], data["path"], data["value"], data["default"], data["text"])


Group = tuple[Poly, Poly]  # (multiplicity, per-item sum): displayed as mult·(inner)


@dataclass(frozen=True)
class FormulaSpec:
    class_name: str
    model_type: str
    transformers_version: str
    roles_fingerprint: str
    symbols: dict[str, str]  # symbol → dotted config path, in display order
    defaults: dict[str, int]  # config path → the class default used when the key is absent
    families: tuple[Family, ...]
    conditions: tuple[Condition, ...]
    independent: tuple[str, ...]  # integer fields that were varied and change no parameter
    # symbol → how sympy, at derivation, said a sympify-able string must spell it (N → Symbol('N')): kept in the
    # cache format and checked when read, but never used to write an expression (render.formula: `sympy_spelling`)
    sympy_names: dict[str, str]
    anchor: dict[str, Any]  # where it was derived: label, values, total, by_role, builds, seconds
    format: int = FORMAT
    # config path → its other spellings: transformers' attribute_map aliases (num_experts for num_local_experts)
    # and the flat fields a sub-config is built from when it is not given (hidden_size for text_config.hidden_size)
    aliases: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # derived symbol → (numerator symbol, denominator symbol): a whole-number quotient, where the count is a
    # polynomial in it but not in the fields (ViT's patches per side, image_size // patch_size)
    derived: dict[str, tuple[str, str]] = field(default_factory=dict)

    # --- structure -------------------------------------------------------------------------------------------

    @functools.cached_property
    def order(self) -> list[str]:
        """The order of factors inside a term: V·D, L·D, E·D·I, K·D²/H (the legend keeps the notes' order)."""
        return factor_order(self.symbols)

    @functools.cached_property
    def _total_poly(self) -> Poly:
        out = Poly()
        for fam in self.families:
            out = out + fam.numel()
        return out

    def total_poly(self) -> Poly:
        return self._total_poly

    def role_groups(self) -> dict[str, list[Group]]:
        """role → [(multiplicity, per-item sum)], roles in the canonical display order."""
        return self._role_groups

    @functools.cached_property
    def _role_groups(self) -> dict[str, list[Group]]:
        from .roles import role_sort_key

        roles: dict[str, list[Family]] = {}
        for fam in self.families:
            roles.setdefault(fam.role, []).append(fam)
        ordered = sorted(roles, key=role_sort_key)
        return {role: _groups(roles[role]) for role in ordered}

    def role_polys(self) -> dict[str, Poly]:
        return self._role_polys

    @functools.cached_property
    def _role_polys(self) -> dict[str, Poly]:
        return {role: _groups_poly(groups) for role, groups in self.role_groups().items()}

    def parts(self) -> list[tuple[str, list[Group]]]:
        """The notes' layout: embeddings, the repeated blocks, then whatever else (final norm, pooler, heads)."""
        return self._parts

    @functools.cached_property
    def _parts(self) -> list[tuple[str, list[Group]]]:
        from .roles import GROUP_TITLES, role_group

        embeddings, blocks, rest = [], [], []
        for fam in self.families:
            if "*" in fam.pattern:
                blocks.append(fam)
            elif role_group(fam.role) == "embeddings":
                embeddings.append(fam)
            else:
                rest.append(fam)
        out = []
        if embeddings:
            out.append(("embeddings", _groups(embeddings)))
        if blocks:
            out.append(("blocks", _groups(blocks)))
        if rest:
            names: list[str] = []
            for fam in rest:
                name = GROUP_TITLES.get(role_group(fam.role), role_group(fam.role))
                if name not in names:
                    names.append(name)
            out.append((", ".join(names), _groups(rest)))
        return out

    def total_groups(self) -> list[Group]:
        return [group for _, groups in self.parts() for group in groups]

    # --- evaluation ------------------------------------------------------------------------------------------

    def values_for(self, config: dict[str, Any], num_labels: int | None = None) -> dict[str, int]:
        """The symbols' values at `config`; AssumptionError names the first assumption it violates."""
        problems = self.violations(config, num_labels)
        if problems:
            raise AssumptionError(problems[0])
        return self._values(config, num_labels)

    def _values(self, config: dict[str, Any], num_labels: int | None) -> dict[str, int]:
        values = {}
        for symbol, path in self.symbols.items():
            value = self.field_value(config, path, num_labels)
            values[symbol] = value  # checked by violations()
        return self.with_derived(values)

    def with_derived(self, values: dict[str, int]) -> dict[str, int]:
        """`values` with the derived symbols added (each a whole-number quotient of two symbols)."""
        return {**values, **{symbol: values[a] // values[b] for symbol, (a, b) in self.derived.items()}}

    def definitions(self) -> dict[str, str]:
        """Each derived symbol's definition in its fields: {"Q": "image_size // patch_size"}."""
        return {symbol: f"{self.symbols[a]} // {self.symbols[b]}" for symbol, (a, b) in self.derived.items()}

    def field_value(self, config: dict[str, Any], path: str, num_labels: int | None = None) -> Any:
        if path == "num_labels":
            return labels_of(config, num_labels)
        value = self.read(config, path)
        if value is ABSENT:
            return self.defaults.get(path, ABSENT)
        return value

    def read(self, config: dict[str, Any], path: str) -> Any:
        """The field at `path` as `config` spells it (read_path), or ABSENT."""
        return read_path(config, path, self.aliases)

    def _spelling_conflicts(self, config: dict[str, Any]) -> list[str]:
        """Two spellings of one field at one level (an attribute_map alias and its field) that disagree."""
        problems = []
        for path, others in self.aliases.items():
            given = {s: get_path(config, s) for s in (path, *others) if s.count(".") == path.count(".")}
            given = {s: v for s, v in given.items() if v is not ABSENT}
            if len({_canon(v) for v in given.values()}) > 1:
                problems.append("the config spells one field two ways with different values: "
                                + ", ".join(f"{s} = {_show(v)}" for s, v in given.items()))
        return problems

    def violations(self, config: dict[str, Any], num_labels: int | None = None) -> list[str]:
        """Every assumption `config` breaks, in words; empty when the formula applies."""
        from .build import validate_config_dict  # torch-free: the same size checks `inspect` applies

        problems = []
        model_type = config.get("model_type")
        if model_type != self.model_type:
            problems.append(f"the formula is for model_type {self.model_type!r}, the config is {model_type!r}")
            return problems
        try:
            validate_config_dict(config)
        except ConfigError as err:
            return [str(err)]
        problems.extend(self._spelling_conflicts(config))
        for cond in self.conditions:
            current = self._current(config, cond)
            if cond.kind == "equals" and _canon(current) != _canon(cond.value):
                problems.append(f"assumes {cond.text}; this config has {cond.path} = {_show(current)}")
            elif cond.kind == "periodic" and not _repeats(current, cond.value):
                problems.append(f"assumes {cond.text}; this config has {cond.path} = {_show(current)}")
            elif cond.kind == "unset" and current not in (None, ABSENT):
                problems.append(f"assumes {cond.text}; this config sets {cond.path} = {_show(current)}")
            elif cond.kind == "same_as":
                other = self._current(config, Condition("", cond.value, None, self._default(cond.value), ""))
                if _canon(current) != _canon(other):
                    problems.append(f"assumes {cond.text}; this config has {cond.path} = {_show(current)}, "
                                    f"{cond.value} = {_show(other)}")
        for symbol, path in self.symbols.items():
            value = self.field_value(config, path, num_labels)
            if value is ABSENT or value is None:
                problems.append(f"the formula needs {path} ({symbol}), which this config does not set "
                                "(the config class would derive it, which changes the formula)")
            elif not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                problems.append(f"{path} ({symbol}) must be a positive integer, got {_show(value)}")
        if problems:
            return problems
        values = self._values(config, num_labels)
        for symbol, definition in self.definitions().items():
            if values[symbol] < 1:
                return [f"{definition} ({symbol}) is {values[symbol]} at this config; the formula needs at least 1"]
        for fam in self.families:
            for i, dim in enumerate((fam.mult, *fam.shape)):
                got = dim.evaluate(values)
                if got.denominator != 1 or got < 0:
                    what = "count" if i == 0 else f"dimension {i - 1}"
                    problems.append(f"{fam.pattern}: {what} would be {got} at this config, not a whole number; "
                                    "the config is not valid for this class")
                    return problems
        return problems

    def _default(self, path: str) -> Any:
        return self.defaults.get(path, ABSENT)

    def _current(self, config: dict[str, Any], cond: Condition) -> Any:
        value = self.read(config, cond.path)
        return cond.default if value is ABSENT else value

    def evaluate(self, values: dict[str, int]) -> "Evaluation":
        values = self.with_derived(values)
        by_role = {role: _int(poly.evaluate(values)) for role, poly in self.role_polys().items()}
        parts = [(name, groups, _int(_groups_poly(groups).evaluate(values))) for name, groups in self.parts()]
        total = _int(self.total_poly().evaluate(values))
        return Evaluation(total=total, by_role=by_role, parts=parts)

    def value_at(self, config: dict[str, Any], num_labels: int | None = None) -> int:
        return self.evaluate(self.values_for(config, num_labels)).total

    # --- (de)serialisation -----------------------------------------------------------------------------------

    def to_json(self) -> dict:
        return {
            "format": self.format,
            "class": self.class_name,
            "model_type": self.model_type,
            "transformers_version": self.transformers_version,
            "roles_fingerprint": self.roles_fingerprint,
            "symbols": self.symbols,
            "defaults": self.defaults,
            "families": [f.to_json() for f in self.families],
            "conditions": [c.to_json() for c in self.conditions],
            "independent": list(self.independent),
            "sympy_names": self.sympy_names,
            "anchor": self.anchor,
            "aliases": {path: list(others) for path, others in self.aliases.items()},
            "derived": {symbol: list(pair) for symbol, pair in self.derived.items()},
        }

    @classmethod
    def from_json(cls, data: Any) -> "FormulaSpec":
        """The spec `to_json` wrote. CacheEntryError names what is wrong with anything else: every field is
        type-checked and bounded here, so that evaluating the result is cheap and cannot fail."""
        expect(isinstance(data, dict), "the entry is not a JSON object")
        expect(is_int(data.get("format")) and data["format"] == FORMAT, f"the entry is not of cache format {FORMAT}")
        for name in ("class", "model_type", "transformers_version", "roles_fingerprint"):
            expect(isinstance(data.get(name), str), f"{name} is not a string")
        symbols = _str_dict(data.get("symbols"), "symbols")
        derived = data.get("derived")
        expect(isinstance(derived, dict) and all(
            isinstance(name, str) and name not in symbols and isinstance(pair, list) and len(pair) == 2
            and all(isinstance(s, str) and s in symbols for s in pair) for name, pair in derived.items()),
            "derived is not a mapping of new symbols to two of the symbols")
        for name in (*symbols, *derived):  # the names that expressions, the legend and LaTeX are written with
            problem = symbol_problem(name)
            expect(problem is None, problem or "")
        for path in symbols.values():  # shown beside them, and in each derived symbol's definition (a // b)
            problem = path_problem(path)
            expect(problem is None, problem or "")
        families = data.get("families")
        conditions = data.get("conditions")
        independent = data.get("independent")
        expect(isinstance(families, list), "families is not a list")
        expect(isinstance(conditions, list), "conditions is not a list")
        expect(isinstance(independent, list) and all(isinstance(p, str) for p in independent),
               "independent is not a list of field names")
        defaults = _str_dict(data.get("defaults"), "defaults", int)
        sympy_names = _check_sympy_names(data.get("sympy_names"), [*symbols, *derived])
        anchor = data.get("anchor")
        expect(isinstance(anchor, dict), "anchor is not a mapping")
        values = _str_dict(anchor.get("values"), "anchor values", int)
        expect(set(values) == set(symbols) | set(derived) and all(0 < v < MAX_COEFFICIENT for v in values.values()),
               "the anchor's values do not match the symbols")
        expect(is_int(anchor.get("total")) and anchor["total"] >= 0, "the anchor has no total")
        by_role = _str_dict(anchor.get("by_role"), "the anchor's counts by role", int)
        expect(all(v > 0 for v in by_role.values()), "the anchor's counts by role are not positive")
        expect(isinstance(anchor.get("label", ""), str), "the anchor's label is not a string")
        aliases = data.get("aliases")
        expect(isinstance(aliases, dict) and all(
            isinstance(path, str) and isinstance(others, list) and all(isinstance(o, str) for o in others)
            for path, others in aliases.items()), "aliases is not a mapping of field names to their spellings")
        for name in ("builds", "seconds"):
            expect(isinstance(anchor.get(name, 0), (int, float)) and not isinstance(anchor.get(name), bool),
                   f"the anchor's {name} is not a number")
        return cls(
            class_name=data["class"],
            model_type=data["model_type"],
            transformers_version=data["transformers_version"],
            roles_fingerprint=data["roles_fingerprint"],
            symbols=symbols,
            defaults=defaults,
            families=tuple(Family.from_json(f, [*symbols, *derived]) for f in families),
            conditions=tuple(Condition.from_json(c) for c in conditions),
            independent=tuple(independent),
            sympy_names=sympy_names,
            anchor=dict(anchor),
            format=data["format"],
            aliases={path: tuple(others) for path, others in aliases.items()},
            derived={name: (pair[0], pair[1]) for name, pair in derived.items()},
        )

    def anchor_problem(self) -> str | None:
        """Why this formula does not reproduce its own anchor count (total and per role), or None when it does."""
        try:
            evaluation = self.evaluate(self.anchor["values"])
        except FormulaError as err:
            return f"at its anchor: {err}"
        except ZeroDivisionError:
            return "at its anchor a derived symbol is 0"
        if evaluation.total != self.anchor["total"]:
            return (f"it gives {evaluation.total:,} at the config it was derived from, which counts "
                    f"{self.anchor['total']:,}")
        if {role: n for role, n in evaluation.by_role.items() if n} != self.anchor["by_role"]:
            return "its split by role differs from the count at the config it was derived from"
        return None

    def key(self) -> str:
        """What makes two formulas of one class different: the structural conditions."""
        payload = json.dumps([self.model_type, self.roles_fingerprint, [c.to_json() for c in self.conditions
                                                                         if c.kind != "integral"]],
                             sort_keys=True, default=str)
        return hashlib.sha256(payload.encode()).hexdigest()[:20]


def factor_order(symbols: Iterable[str]) -> list[str]:
    rank = {s: i for i, s in enumerate(FACTOR_ORDER)}
    arrival = list(symbols)
    return sorted(arrival, key=lambda s: (rank.get(s, rank.get(s.rsplit("_", 1)[0], len(rank))), arrival.index(s)))


@dataclass(frozen=True)
class Evaluation:
    total: int
    by_role: dict[str, int]
    parts: list[tuple[str, list[Group], int]]


def _groups(families: list[Family]) -> list[Group]:
    groups: dict[Poly, Poly] = {}
    for fam in families:
        groups[fam.mult] = groups.get(fam.mult, Poly()) + fam.per_item()
    return [(mult, inner) for mult, inner in groups.items() if not inner.is_zero() and not mult.is_zero()]


def _groups_poly(groups: list[Group]) -> Poly:
    out = Poly()
    for mult, inner in groups:
        out = out + mult * inner
    return out


def _int(value: Fraction) -> int:
    if value.denominator != 1:
        raise FormulaError(f"the formula gives a fractional count ({value}) here: the config is not valid for it")
    return int(value)


def labels_of(config: dict[str, Any], num_labels: int | None = None) -> Any:
    """num_labels as transformers derives it: --num-labels, else num_labels, else len(id2label), else 2."""
    if num_labels is not None:
        return num_labels
    if "num_labels" in config:
        return config["num_labels"]
    id2label = config.get("id2label")
    if isinstance(id2label, dict) and id2label:
        return len(id2label)
    return 2


def get_path(config: dict[str, Any], path: str) -> Any:
    node: Any = config
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return ABSENT
        node = node[part]
    return node


def read_path(config: dict[str, Any], path: str, aliases: dict[str, Any]) -> Any:
    """The field at `path`, under whichever of its spellings (`aliases[path]`) `config` uses; ABSENT if none.

    As transformers reads them: a sub-config that is given is read and the flat copies beside it are ignored (a
    given text_config without hidden_size means the class default); a flat field counts only when its
    sub-config is not given. Spellings at one level (attribute_map aliases) are read in order.
    """
    spellings = (path, *aliases.get(path, ()))
    for depth in sorted({s.count(".") for s in spellings}, reverse=True):
        level = [s for s in spellings if s.count(".") == depth]
        for spelling in level:
            value = get_path(config, spelling)
            if value is not ABSENT:
                return value
        if depth and any(isinstance(get_path(config, s.rpartition(".")[0]), dict) for s in level):
            return ABSENT
    return ABSENT


def set_path(config: dict[str, Any], path: str, value: Any) -> None:
    parts = path.split(".")
    node = config
    for part in parts[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = {}
            node[part] = child
        node = child
    node[parts[-1]] = value


def _repeats(values: Any, period: list) -> bool:
    return (isinstance(values, list) and bool(values) and bool(period)
            and all(_canon(v) == _canon(period[i % len(period)]) for i, v in enumerate(values)))


def _canon(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def _show(value: Any) -> str:
    if value is ABSENT:
        return "(not set)"
    return json.dumps(value, default=str)
