"""Each traced allocation's size as a polynomial in the batch B and the sequence length S, read from its shape.

Two timelines of the same cut, at (B₁, S₁) and (B₂, S₂), hold the same allocations in the same order; only the
dimensions that follow B or S differ. Each dimension is read as one of a few forms, the first that both traces give
exactly:

    a constant          d₁ = d₂
    p·S + q             the sequence (S, S − 1 for shifted labels, 2·S for a concatenation)
    p·B·S + q·B         flattened tokens (B·S, B·(S − 1))
    p·B + q             the batch

and a size is the element size times the product of its dimensions: exact integers on monomials B^i·S^j. A storage
whose bytes are not its tensor's elements × element size must be the same in both traces (a constant) or the cut is
not derivable. The sample points are chosen so that no two forms agree on both (derive.py); a third trace at another
point checks every size before a recipe is used.
"""

from __future__ import annotations

from typing import Sequence

# A polynomial: ((i, j, c), …) for Σ c·B^i·S^j, sorted, no zero coefficients.
Poly = tuple[tuple[int, int, int], ...]
_OFFSETS = range(-4, 5)


class NotDerivable(ValueError):
    """The traces do not give a closed form: why, in words."""


def _poly(terms: dict[tuple[int, int], int]) -> Poly:
    return tuple(sorted((i, j, c) for (i, j), c in terms.items() if c))


def multiply(a: Poly, b: Poly) -> Poly:
    terms: dict[tuple[int, int], int] = {}
    for i, j, c in a:
        for k, m, d in b:
            terms[(i + k, j + m)] = terms.get((i + k, j + m), 0) + c * d
    return _poly(terms)


def evaluate(poly: Poly, batch: int, seq: int) -> int:
    return sum(c * batch ** i * seq ** j for i, j, c in poly)


def dimension(first: int, second: int, at1: tuple[int, int], at2: tuple[int, int]) -> Poly:
    """The form of one dimension that is `first` at (B₁, S₁) and `second` at (B₂, S₂)."""
    (b1, s1), (b2, s2) = at1, at2
    if first == second:
        return _poly({(0, 0): first})
    # p·S + q
    if s1 != s2 and (first - second) % (s1 - s2) == 0:
        p = (first - second) // (s1 - s2)
        if p > 0 and first - p * s1 in _OFFSETS:
            return _poly({(0, 1): p, (0, 0): first - p * s1})
    # p·B·S + q·B
    for q in _OFFSETS:
        if first % b1 == 0 and second % b2 == 0:
            u1, u2 = first // b1 - q, second // b2 - q
            if s1 != s2 and u1 % s1 == 0 and u2 % s2 == 0 and u1 // s1 == u2 // s2 and u1 // s1 > 0:
                return _poly({(1, 1): u1 // s1, (1, 0): q})
    # p·B + q
    if b1 != b2 and (first - second) % (b1 - b2) == 0:
        p = (first - second) // (b1 - b2)
        if p > 0 and first - p * b1 in _OFFSETS:
            return _poly({(1, 0): p, (0, 0): first - p * b1})
    raise NotDerivable(f"a dimension of {first} at B={b1}, S={s1} and {second} at B={b2}, S={s2} follows no form "
                       "of B and S")


def size(shape1: Sequence[int], shape2: Sequence[int], nbytes1: int, nbytes2: int, itemsize: int,
         at1: tuple[int, int], at2: tuple[int, int]) -> Poly:
    """The bytes of one allocation as a polynomial, from its shape and bytes in the two traces."""
    if len(shape1) != len(shape2):
        raise NotDerivable(f"a tensor of shape {tuple(shape1)} in one trace is {tuple(shape2)} in the other")
    elements1 = elements2 = 1
    for d in shape1:
        elements1 *= d
    for d in shape2:
        elements2 *= d
    if elements1 * itemsize != nbytes1 or elements2 * itemsize != nbytes2:
        if nbytes1 == nbytes2:  # a storage larger than its tensor, the same in both: a constant
            return _poly({(0, 0): nbytes1})
        raise NotDerivable(f"a storage of {nbytes1:,} B holds a tensor of shape {tuple(shape1)}")
    poly = _poly({(0, 0): itemsize})
    for d1, d2 in zip(shape1, shape2):
        poly = multiply(poly, dimension(d1, d2, at1, at2))
    if evaluate(poly, *at1) != nbytes1 or evaluate(poly, *at2) != nbytes2:  # pragma: no cover - arithmetic
        raise NotDerivable(f"the size of a tensor of shape {tuple(shape1)} does not reproduce")
    return poly


def words(poly: Poly) -> str:
    """"4·B·S² + 8·S": the polynomial in the notes' notation."""
    if not poly:
        return "0"

    def power(name: str, n: int) -> str:
        return "" if n == 0 else name if n == 1 else f"{name}{'²³⁴⁵'[n - 2] if n <= 5 else '^' + str(n)}"

    parts = []
    for i, j, c in sorted(poly, key=lambda t: (-(t[0] + t[1]), -t[1])):
        monomial = "·".join(x for x in (power("B", i), power("S", j)) if x)
        parts.append((f"{abs(c):,}" if not monomial or abs(c) != 1 else "") + ("·" if monomial and abs(c) != 1 else "")
                     + monomial if monomial else f"{abs(c):,}")
        parts[-1] = ("− " if c < 0 else "+ ") + parts[-1]
    text = " ".join(parts)
    return text[2:] if text.startswith("+ ") else "−" + text[2:]
