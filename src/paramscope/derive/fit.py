"""Exact fitting: each family's multiplicity and dimensions as a Laurent polynomial in the varied fields.

Along each field, a quantity is fitted as a·x^e + b (e in 1, −1, 2, −2, 3) from the anchor and the field's two
other values; the product of those exponent sets gives candidate monomials (K·D/H, N − N_dense, r_kv + d_rope), whose
coefficients are solved over the rationals from every build, joint variations included (more of them while the
builds do not separate the terms). A quantity that no polynomial in the fields gives, but one in a whole-number
quotient a // b does, is fitted in that quotient (ViT's positions: (image_size // patch_size)² + 1).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from fractions import Fraction

from ..errors import FormulaError
from ..polynomial import Poly
from .probe import Prober, Snapshot
from .screen import Design, Observation, joint

_MAX_JOINT = 40

FamilyKey = tuple[str, str, int]  # (pattern, role, k), as in Snapshot.fams


@dataclass(frozen=True)
class Fit:
    """What `fit` found."""

    quantities: dict[FamilyKey, list[Poly]]  # family → [multiplicity, dimension 0, …] in field paths
    quotients: dict[str, tuple[str, str]]  # "a//b" → (a, b): the whole-number quotients the polynomials use
    joint: list[Observation]  # the joint variations the fit used (more than it was given when it needed them)


def fit(prober: Prober, design: Design, given: list[Observation]) -> Fit:
    """Every quantity of the anchor's families, fitted over the anchor, the axes and the joint variations
    `given`; FormulaError when no polynomial gives one, or when the builds cannot separate the terms."""
    return _Fitter(prober, design).run(list(given))


def quantity(snap: Snapshot, key: FamilyKey, i: int) -> int | None:
    """A family's multiplicity (i = 0) or dimension i − 1 in a build; None when the build has no such family."""
    entry = snap.fams.get(key)
    if entry is None:
        return None
    return entry[0] if i == 0 else entry[1][i - 1]


class _Fitter:
    def __init__(self, prober: Prober, design: Design):
        self.prober = prober
        self.design = design
        self.anchor = prober.anchor
        self.class_name = prober.class_name
        self.quotients: dict[str, tuple[str, str]] = {}

    def run(self, joint_obs: list[Observation]) -> Fit:
        for _ in range(8):
            obs = self.design.observations(self.anchor, joint_obs)
            fitted: dict[FamilyKey, list[Poly]] = {}
            short = False
            for key, (_, shape) in self.anchor.fams.items():
                comps = []
                for i in range(len(shape) + 1):
                    poly = self._fit(key, i, obs)
                    if poly is None:
                        short = True
                        break
                    comps.append(poly)
                if short:
                    break
                fitted[key] = comps
            if not short:
                return Fit(fitted, dict(self.quotients), joint_obs)
            if len(joint_obs) >= _MAX_JOINT:
                break
            joint_obs.extend(joint(self.prober, self.design, count=6, seed=len(joint_obs) + 7, exclude=joint_obs))
        raise FormulaError(f"not enough independent builds to separate the terms of {self.class_name}'s formula")

    def _fit(self, key: FamilyKey, i: int, obs: list[Observation]) -> Poly | None:
        """One multiplicity (i = 0) or dimension as an exact Laurent polynomial; None: needs more builds."""
        y0 = quantity(self.anchor, key, i)
        values0 = self.design.values0
        exponents: dict[str, tuple[int, ...]] = {}
        for rep in self.design.variables:
            points = [(values0[rep], y0)] + [(x, quantity(snap, key, i)) for x, snap in self.design.axis[rep]]
            if all(y == y0 for _, y in points):
                continue
            exponents[rep] = self._axis_exponents(key, i, rep, points)
        monomials = [dict(zip(exponents, combo)) for combo in itertools.product(*exponents.values())]
        found = _solve_poly(monomials, key, i, obs)
        if found is None:
            quotient = self._fit_quotient(key, i, exponents, obs)
            if quotient is not None:
                return quotient
            raise FormulaError(
                f"{key[0]}: its {_what(i)} is no polynomial in the config's fields that paramscope can find, so no "
                f"closed form is given for {self.class_name}"
            )
        return None if found == "underdetermined" else found

    def _fit_quotient(self, key: FamilyKey, i: int, exponents: dict[str, tuple[int, ...]], obs) -> Poly | None:
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

            def point(assignment: dict[str, int], a=a, b=b, name=name) -> dict[str, int] | None:
                return None if assignment[a] < assignment[b] else {**assignment, name: assignment[a] // assignment[b]}

            found = _solve_poly(monomials, key, i, obs, point)
            if found is None or found == "underdetermined":
                continue
            self.quotients[name] = (a, b)
            return found
        return None

    def _axis_exponents(self, key: FamilyKey, i: int, rep: str, points) -> tuple[int, ...]:
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
            f"{key[0]}: its {_what(i)} varies with {rep} in no way a polynomial can express "
            f"({', '.join(f'{x} → {y}' for x, y in points)}), so no closed form is given for {self.class_name}"
        )


def _what(i: int) -> str:
    return "count" if i == 0 else f"dimension {i - 1}"


def _solve_poly(monomials: list[dict[str, int]], key: FamilyKey, i: int, obs: list[Observation],
                point=lambda assignment: assignment):
    """The quantity as Σ coefficient·monomial over the builds (`point` maps an assignment to the monomials'
    variables, or None to leave the build out): a Poly, None when no such sum fits every build, or
    'underdetermined' when the builds do not fix the coefficients."""
    rows, rhs = [], []
    for assignment, snap in obs:
        y = quantity(snap, key, i)
        at = None if y is None else point(assignment)
        if at is None:
            continue
        rows.append([_monomial_value(m, at) for m in monomials])
        rhs.append(Fraction(y))
    solution = _solve(rows, rhs)
    if solution is None or solution == "underdetermined":
        return solution
    poly = Poly()
    for mono, coef in zip(monomials, solution):
        if coef:
            poly = poly + Poly.monomial(mono, coef)
    return poly


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
