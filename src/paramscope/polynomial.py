"""Laurent polynomials with rational coefficients in a config's symbols: the algebra formulas and templates are
written in, and their bounded JSON form.

A `Poly` maps monomials (sorted (symbol, exponent) pairs; exponents may be negative) to Fractions and keeps the
order in which terms first appeared, for display. `to_json` writes each term as [coefficient, {symbol: exponent}],
a coefficient an integer or "p/q"; `from_json` refuses (CacheEntryError) anything else, an exponent beyond
±MAX_EXPONENT or a coefficient of 2**63 or more before any arithmetic, so that evaluating a cached polynomial is
cheap and cannot fail.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any, Iterable

from .disk_cache import expect, is_int

MAX_EXPONENT = 6  # derived formulas' exponents come from fits in 1, −1, 2, −2, 3
MAX_COEFFICIENT = 2**63  # numerator and denominator, in absolute value
_COEFFICIENT = re.compile(r"-?[0-9]{1,19}(?:/[0-9]{1,19})?")

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
        expect(isinstance(data, list), "a polynomial is not a list of terms")
        terms = []
        for term in data:
            expect(isinstance(term, list) and len(term) == 2, "a polynomial term is not [coefficient, exponents]")
            coef, exps = term
            expect(isinstance(exps, dict), "a term's exponents are not a mapping")
            for name, e in exps.items():
                expect(known is None or name in known, f"a term names the unknown symbol {str(name)[:40]!r}")
                expect(is_int(e) and abs(e) <= MAX_EXPONENT, f"an exponent is not an integer within "
                                                            f"±{MAX_EXPONENT}")
            terms.append((tuple(exps.items()), _coefficient(coef)))
        return cls(terms)


def _coef_json(c: Fraction) -> int | str:
    return c.numerator if c.denominator == 1 else f"{c.numerator}/{c.denominator}"


def _coefficient(value: Any) -> Fraction:
    """A coefficient as `_coef_json` wrote it (an int, or "p/q"), refused before any arithmetic when too large."""
    if is_int(value):
        expect(abs(value) < MAX_COEFFICIENT, "a coefficient is out of bounds")
        return Fraction(value)
    expect(isinstance(value, str) and _COEFFICIENT.fullmatch(value) is not None,
           "a coefficient is neither an integer nor a fraction p/q")
    num, _, den = value.partition("/")
    expect(abs(int(num)) < MAX_COEFFICIENT and int(den or 1) < MAX_COEFFICIENT and int(den or 1) != 0,
           "a coefficient is out of bounds")
    return Fraction(int(num), int(den or 1))


def product(polys: Iterable[Poly]) -> Poly:
    out = Poly.const(1)
    for p in polys:
        out = out * p
    return out
