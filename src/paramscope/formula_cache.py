"""Closed-form parameter formulas as data, kept on disk, and used without torch, transformers or sympy.

A derived formula is stored as a `FormulaSpec`: for each tensor family (a parameter name with its layer and
expert indices replaced by `*`) its multiplicity and its shape, each a polynomial in the config's integer
fields, plus the conditions (structural flags, derived fields, equalities) under which those polynomials hold.
Evaluating a spec at a config is plain integer arithmetic on that data, so the cached path of
`paramscope formula` reads one small JSON file and imports neither torch, transformers nor sympy.

Cache layout (one file per formula, written atomically: temp file + os.replace, so concurrent runs never
see a half-written file, and two writers of the same formula write the same bytes):

    <cache>/formulas/v<FORMAT>/<transformers version>/<class>/<hash of the structural conditions>.json
    <cache>/formulas/v<FORMAT>/<transformers version>/routes/<hash of the request>.json   (request → class)

<cache> is $PARAMSCOPE_CACHE_DIR, else the platform cache directory (~/.cache/paramscope on Linux).

Reading the cache never trusts it: only regular files of at most MAX_ENTRY_BYTES are opened (a symlink, a FIFO
or a device costs one lstat), every field is type-checked and bounded (exponents, coefficients, counts) before
any arithmetic, and a formula must reproduce its own anchor (the count, total and per role, of the config it was
derived from) before it is used. An entry that fails any of these is skipped with a note in `Lookup.rejected`;
`lookup` raises for no cache content.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import stat
import sys
import tempfile
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any, Iterable, Iterator

# formula.py and older callers import the formula errors from here; they live in errors.py
from .errors import AssumptionError, ConfigError, FormulaError, FormulaMismatchError  # noqa: F401

FORMAT = 2  # 2: the anchor carries its per-role counts, and every entry is checked against its anchor
# Factors inside a term follow this order (multiplicities first, the width D late, divisors last).
FACTOR_ORDER = ("N", "N_dec", "N_dense", "G", "G_in", "E", "E_sh", "V", "L", "T", "C", "B", "K", "D", "D_emb",
                "I", "I_dec", "I_moe", "I_sh", "H", "H_dec", "d_h", "r_q", "r_kv", "d_nope", "d_rope", "d_v", "d_rot")
ABSENT = "<absent>"  # JSON marker: the key is not in the config and the config class declares no default

# Bounds on what a cache entry may hold, checked before any arithmetic. Derived formulas stay far inside them:
# exponents come from fits in 1, −1, 2, −2, 3; coefficients are small fractions; an entry is tens of kB.
MAX_ENTRY_BYTES = 4 * 1024 * 1024
MAX_EXPONENT = 6
MAX_COEFFICIENT = 2**63  # numerator and denominator, in absolute value
MAX_CACHED_ENTRIES = 256  # per class directory
_COEFFICIENT = re.compile(r"-?[0-9]{1,19}(?:/[0-9]{1,19})?")
_CONDITION_KINDS = frozenset({"equals", "unset", "same_as", "present", "integral", "periodic"})


class CacheEntryError(ValueError):
    """A cache entry of the wrong shape or out of bounds: skipped with this note, never used."""


def _expect(ok: bool, what: str) -> None:
    if not ok:
        raise CacheEntryError(what)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _str_dict(data: Any, what: str, values=str) -> dict:
    _expect(isinstance(data, dict) and all(isinstance(k, str) and isinstance(v, values) and not isinstance(v, bool)
                                           for k, v in data.items()), f"{what} is not a mapping of the right types")
    return dict(data)


# --------------------------------------------------------------------------------------------------- polynomials

Monomial = tuple[tuple[str, int], ...]  # ((symbol, exponent), ...) sorted by symbol; exponents may be negative


def _mono_mul(a: Monomial, b: Monomial) -> Monomial:
    exps: dict[str, int] = dict(a)
    for name, e in b:
        exps[name] = exps.get(name, 0) + e
    return tuple(sorted((n, e) for n, e in exps.items() if e))


def mono_degree(mono: Monomial) -> int:
    return sum(e for _, e in mono)


class Poly:
    """A Laurent polynomial with rational coefficients; term order is kept (first appearance) for display."""

    __slots__ = ("terms",)

    def __init__(self, terms: Iterable[tuple[Monomial, Any]] = ()):
        self.terms: dict[Monomial, Fraction] = {}
        for mono, coef in terms:
            self._add(tuple(sorted((n, e) for n, e in mono if e)), Fraction(coef))

    @classmethod
    def const(cls, value: Any) -> "Poly":
        return cls([((), value)])

    @classmethod
    def var(cls, name: str, exponent: int = 1) -> "Poly":
        return cls([(((name, exponent),), 1)])

    @classmethod
    def monomial(cls, exps: dict[str, int], coef: Any = 1) -> "Poly":
        return cls([(tuple(exps.items()), coef)])

    def _add(self, mono: Monomial, coef: Fraction) -> None:
        new = self.terms.get(mono, Fraction(0)) + coef
        if new:
            self.terms[mono] = new
        else:
            self.terms.pop(mono, None)

    def __add__(self, other: "Poly") -> "Poly":
        out = Poly()
        out.terms = dict(self.terms)
        for mono, coef in other.terms.items():
            out._add(mono, coef)
        return out

    def __mul__(self, other: "Poly") -> "Poly":
        out = Poly()
        for m1, c1 in self.terms.items():
            for m2, c2 in other.terms.items():
                out._add(_mono_mul(m1, m2), c1 * c2)
        return out

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Poly) and self.terms == other.terms

    def __hash__(self) -> int:
        return hash(frozenset(self.terms.items()))

    def __repr__(self) -> str:
        return f"Poly({self.to_json()!r})"

    def is_zero(self) -> bool:
        return not self.terms

    def constant(self) -> Fraction | None:
        """The value when the polynomial is a constant, else None."""
        if not self.terms:
            return Fraction(0)
        if len(self.terms) == 1 and () in self.terms:
            return self.terms[()]
        return None

    def symbols(self) -> set[str]:
        return {name for mono in self.terms for name, _ in mono}

    def has_denominator(self) -> bool:
        return any(e < 0 for mono in self.terms for _, e in mono) or any(c.denominator != 1 for c in self.terms.values())

    def evaluate(self, values: dict[str, int]) -> Fraction:
        total = Fraction(0)
        for mono, coef in self.terms.items():
            num, den = coef.numerator, coef.denominator
            for name, e in mono:
                if e > 0:
                    num *= values[name] ** e
                else:
                    den *= values[name] ** (-e)
            total += Fraction(num, den)
        return total

    def to_json(self) -> list:
        return [[_coef_json(c), dict(mono)] for mono, c in self.terms.items()]

    @classmethod
    def from_json(cls, data: Any, symbols: Iterable[str] | None = None) -> "Poly":
        """The polynomial `to_json` wrote; CacheEntryError for anything else, or out of bounds, or naming a
        symbol outside `symbols`."""
        known = None if symbols is None else set(symbols)
        _expect(isinstance(data, list), "a polynomial is not a list of terms")
        terms = []
        for term in data:
            _expect(isinstance(term, list) and len(term) == 2, "a polynomial term is not [coefficient, exponents]")
            coef, exps = term
            _expect(isinstance(exps, dict), "a term's exponents are not a mapping")
            for name, e in exps.items():
                _expect(known is None or name in known, f"a term names the unknown symbol {str(name)[:40]!r}")
                _expect(_is_int(e) and abs(e) <= MAX_EXPONENT, f"an exponent is not an integer within "
                                                              f"±{MAX_EXPONENT}")
            terms.append((tuple(exps.items()), _coefficient(coef)))
        return cls(terms)


def _coef_json(c: Fraction) -> int | str:
    return c.numerator if c.denominator == 1 else f"{c.numerator}/{c.denominator}"


def _coefficient(value: Any) -> Fraction:
    """A coefficient as `_coef_json` wrote it (an int, or "p/q"), refused before any arithmetic when too large."""
    if _is_int(value):
        _expect(abs(value) < MAX_COEFFICIENT, "a coefficient is out of bounds")
        return Fraction(value)
    _expect(isinstance(value, str) and _COEFFICIENT.fullmatch(value) is not None,
            "a coefficient is neither an integer nor a fraction p/q")
    num, _, den = value.partition("/")
    _expect(abs(int(num)) < MAX_COEFFICIENT and int(den or 1) < MAX_COEFFICIENT and int(den or 1) != 0,
            "a coefficient is out of bounds")
    return Fraction(int(num), int(den or 1))


def product(polys: Iterable[Poly]) -> Poly:
    out = Poly.const(1)
    for p in polys:
        out = out * p
    return out


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
        _expect(isinstance(data, dict) and isinstance(data.get("pattern"), str) and isinstance(data.get("role"), str)
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
        _expect(isinstance(data, dict) and {"kind", "path", "value", "default", "text"} <= set(data)
                and isinstance(data["kind"], str) and data["kind"] in _CONDITION_KINDS and isinstance(data["path"], str)
                and isinstance(data["text"], str), "a condition is not {kind, path, value, default, text}")
        _expect(data["kind"] != "same_as" or isinstance(data["value"], str), "a same_as condition names no field")
        _expect(data["kind"] != "periodic" or isinstance(data["value"], list) and data["value"],
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
    sympy_names: dict[str, str]  # symbol → how a sympify-able string must spell it (N → Symbol('N'))
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
        _expect(isinstance(data, dict), "the entry is not a JSON object")
        _expect(_is_int(data.get("format")) and data["format"] == FORMAT, f"the entry is not of cache format {FORMAT}")
        for name in ("class", "model_type", "transformers_version", "roles_fingerprint"):
            _expect(isinstance(data.get(name), str), f"{name} is not a string")
        symbols = _str_dict(data.get("symbols"), "symbols")
        derived = data.get("derived")
        _expect(isinstance(derived, dict) and all(
            isinstance(name, str) and name not in symbols and isinstance(pair, list) and len(pair) == 2
            and all(isinstance(s, str) and s in symbols for s in pair) for name, pair in derived.items()),
            "derived is not a mapping of new symbols to two of the symbols")
        families = data.get("families")
        conditions = data.get("conditions")
        independent = data.get("independent")
        _expect(isinstance(families, list), "families is not a list")
        _expect(isinstance(conditions, list), "conditions is not a list")
        _expect(isinstance(independent, list) and all(isinstance(p, str) for p in independent),
                "independent is not a list of field names")
        defaults = _str_dict(data.get("defaults"), "defaults", int)
        sympy_names = _str_dict(data.get("sympy_names"), "sympy_names")
        anchor = data.get("anchor")
        _expect(isinstance(anchor, dict), "anchor is not a mapping")
        values = _str_dict(anchor.get("values"), "anchor values", int)
        _expect(set(values) == set(symbols) | set(derived) and all(0 < v < MAX_COEFFICIENT for v in values.values()),
                "the anchor's values do not match the symbols")
        _expect(_is_int(anchor.get("total")) and anchor["total"] >= 0, "the anchor has no total")
        by_role = _str_dict(anchor.get("by_role"), "the anchor's counts by role", int)
        _expect(all(v > 0 for v in by_role.values()), "the anchor's counts by role are not positive")
        _expect(isinstance(anchor.get("label", ""), str), "the anchor's label is not a string")
        aliases = data.get("aliases")
        _expect(isinstance(aliases, dict) and all(
            isinstance(path, str) and isinstance(others, list) and all(isinstance(o, str) for o in others)
            for path, others in aliases.items()), "aliases is not a mapping of field names to their spellings")
        for name in ("builds", "seconds"):
            _expect(isinstance(anchor.get(name, 0), (int, float)) and not isinstance(anchor.get(name), bool),
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


# --------------------------------------------------------------------------------------------- the disk cache


def cache_root() -> Path:
    env = os.environ.get("PARAMSCOPE_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "paramscope"
    if os.name == "nt":
        base = os.environ.get("LOCALAPPDATA") or str(Path.home() / "AppData" / "Local")
        return Path(base) / "paramscope" / "Cache"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "paramscope"


_VERSION_LINE = re.compile(r"^__version__\s*=\s*[\"']([^\"']+)[\"']", re.M)


def installed_transformers_version() -> str | None:
    """The installed transformers version, without importing transformers (nor importlib.metadata: 15 ms)."""
    from importlib.machinery import PathFinder

    try:
        spec = PathFinder.find_spec("transformers")  # searches sys.path; imports nothing
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.origin:
        return None
    try:
        with open(spec.origin, encoding="utf-8") as handle:
            match = _VERSION_LINE.search(handle.read(8192))
    except OSError:
        match = None
    if match:
        return match.group(1)
    from importlib import metadata

    try:
        return metadata.version("transformers")
    except metadata.PackageNotFoundError:
        return None


def roles_fingerprint() -> str:
    """Changes whenever the role rules change, so that a cached per-role split is never stale."""
    from . import roles

    try:
        payload = Path(roles.__file__).read_bytes()
    except OSError:  # e.g. a zipped install: fall back to the public role table
        payload = json.dumps(roles.ROLES).encode()
    return hashlib.sha256(payload).hexdigest()[:12]


def _safe(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name) or "_"


def _version_dir(version: str) -> Path:
    return cache_root() / "formulas" / f"v{FORMAT}" / _safe(version)


def route_key(config: dict[str, Any], *, model_class: str | None, task: str | None) -> str | None:
    """How the class was asked for, as a string; None when --class names it (no route needed)."""
    if model_class:
        return None
    model_type = config.get("model_type")
    if task:
        from .build import resolve_task

        return f"{model_type}|task|{resolve_task(task)}"
    architectures = config.get("architectures") or []
    first = architectures[0] if isinstance(architectures, list) and architectures else ""
    return f"{model_type}|default|{first if isinstance(first, str) else ''}"


def _route_path(version: str, key: str) -> Path:
    return route_file(_version_dir(version), key)


def route_file(directory: Path, key: str) -> Path:
    """Where a cache directory keeps the class a request (`route_key`) was answered with."""
    return directory / "routes" / (hashlib.sha256(key.encode()).hexdigest()[:20] + ".json")


def atomic_write_json(path: Path, data: Any) -> None:
    """Write `data` to `path` so that readers only ever see the old file or the complete new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(data, handle, separators=(",", ":"))
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


_UNREADABLE = object()  # what _read_json gives for anything but a regular file of at most MAX_ENTRY_BYTES of JSON


def _read_json(path: Path) -> Any:
    """The JSON in `path` when it is a regular file of at most MAX_ENTRY_BYTES; _UNREADABLE otherwise.

    lstat decides before anything is opened, so a symlink (to /dev/zero, say), a FIFO or a device costs nothing;
    the opened file is checked again (O_NOFOLLOW, fstat) in case it was swapped in between.
    """
    try:
        info = os.lstat(path)
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_ENTRY_BYTES:
            return _UNREADABLE
        flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
        fd = os.open(path, flags)
        with os.fdopen(fd, "rb") as handle:
            opened = os.fstat(handle.fileno())
            if not stat.S_ISREG(opened.st_mode) or (opened.st_dev, opened.st_ino) != (info.st_dev, info.st_ino):
                return _UNREADABLE
            raw = handle.read(MAX_ENTRY_BYTES + 1)
        if len(raw) > MAX_ENTRY_BYTES:
            return _UNREADABLE
        return json.loads(raw.decode("utf-8"))
    except (OSError, ValueError, RecursionError):  # ValueError: bad UTF-8, bad JSON, a 5000-digit integer
        return _UNREADABLE


def store(spec: FormulaSpec, *, route: str | None = None) -> Path | None:
    """Keep `spec` on disk; returns its path, or None when the cache directory cannot be written."""
    directory = _version_dir(spec.transformers_version)
    path = directory / _safe(spec.class_name) / f"{spec.key()}.json"
    try:
        atomic_write_json(path, spec.to_json())
        if route:
            atomic_write_json(_route_path(spec.transformers_version, route), {"route": route, "class": spec.class_name})
    except OSError:
        return None
    return path


def read_entries(entries: Iterable[Path], parse) -> Iterator[tuple[Path, Any, str | None]]:
    """(entry, parse(its JSON), None) for each of the first MAX_CACHED_ENTRIES cache files, or (entry, None, why
    not) for one that is unreadable or that `parse` rejects (CacheEntryError)."""
    for entry in list(entries)[:MAX_CACHED_ENTRIES]:
        data = _read_json(entry)
        if data is _UNREADABLE:
            yield entry, None, (f"skipped: not a readable JSON file of at most "
                                f"{MAX_ENTRY_BYTES // 1024 // 1024} MiB")
            continue
        try:
            yield entry, parse(data), None
        except CacheEntryError as err:
            yield entry, None, f"discarded: {err}"


@dataclass(frozen=True)
class Lookup:
    spec: FormulaSpec | None
    values: dict[str, int] = field(default_factory=dict)
    path: Path | None = None
    class_name: str | None = None
    rejected: tuple[str, ...] = ()  # why the cached formulas of this class did not apply


def lookup(config: dict[str, Any], *, model_class: str | None = None, task: str | None = None,
           num_labels: int | None = None) -> Lookup:
    """The cached formula whose assumptions `config` meets, with the symbols' values; never imports torch."""
    version = installed_transformers_version()
    if version is None or not isinstance(config.get("model_type"), str):
        return Lookup(None)
    class_name = model_class
    if class_name is None:
        route = _read_json(_route_path(version, route_key(config, model_class=None, task=task) or ""))
        if not isinstance(route, dict) or not isinstance(route.get("class"), str):
            return Lookup(None)
        class_name = route["class"]
    directory = _version_dir(version) / _safe(class_name)
    try:
        entries = sorted(directory.glob("*.json"))
    except OSError:
        return Lookup(None, class_name=class_name)
    fingerprint = roles_fingerprint()
    rejected = []
    for entry, spec, why_not in read_entries(entries, FormulaSpec.from_json):
        if spec is None:
            rejected.append(f"cache entry {entry.name} {why_not}")
            continue
        if spec.roles_fingerprint != fingerprint or spec.class_name != class_name:
            continue
        if entry.stem != spec.key():
            rejected.append(f"cache entry {entry.name} discarded: its conditions are not the ones it was filed under")
            continue
        problem = spec.anchor_problem()
        if problem:
            rejected.append(f"cache entry {entry.name} discarded: {problem}")
            continue
        problems = spec.violations(config, num_labels)
        if problems:
            rejected.append(problems[0])
            continue
        return Lookup(spec, spec._values(config, num_labels), entry, class_name)
    return Lookup(None, class_name=class_name, rejected=tuple(rejected))
