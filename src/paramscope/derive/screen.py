"""Which fields a derivation varies, and at which values: structural flags found by group testing, each integer
field moved alone (independent, varied, tied to an equal field or held fixed), and random joint variations.

A flag that changes the parameters when changed is structural: it becomes an assumption. An integer field is
varied twice, at values that keep the anchor's divisibility relations (hidden size by heads) intact; one that
adds or removes tensors is tied to an equal field (ELECTRA's embedding_size = hidden_size) or held fixed. Fields
with no conventional symbol are screened together first. Joint variations of all the varied fields separate
products from sums.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any, Callable

from .fields import Field, SYMBOL_OF_KEY, rank
from .probe import Prober, Snapshot

_ACTIVATIONS = ("gelu", "relu", "silu", "gelu_new", "tanh")
_JUNK = "paramscope-probe"

Assignment = dict[str, int]  # representative field → its value
Observation = tuple[Assignment, Snapshot]


@dataclass(frozen=True)
class Design:
    """How the integer fields are varied: `design_variations` finds it."""

    groups: dict[str, list[str]]  # representative → the fields moved with it (itself first)
    axis: dict[str, list[tuple[int, Snapshot]]]  # varied representative → its two other values and their builds
    independent: tuple[str, ...]  # fields that change no parameter
    fixed: tuple[Field, ...]  # fields held at their value: the set of tensors changes with them
    values0: Assignment  # every representative's value at the anchor

    @property
    def variables(self) -> list[str]:
        """The varied representatives, in rank order: the formula's symbols."""
        return [g for g in self.groups if g in self.axis]

    def overrides(self, assignment: Assignment) -> dict[str, int]:
        """The probe overrides for an assignment of representatives: each with the fields moved with it."""
        out: dict[str, int] = {}
        for rep, x in assignment.items():
            out.update(_assign(self.groups, rep, x))
        return out

    def at(self, joint: list[Observation]) -> list[Observation]:
        """Joint variations as full assignments (the others at their anchor values)."""
        return [({**self.values0, **assignment}, snap) for assignment, snap in joint]

    def observations(self, anchor: Snapshot, joint: list[Observation]) -> list[Observation]:
        """Every build the fit uses: the anchor, each field's axis, the joint variations."""
        obs = [(dict(self.values0), anchor)]
        for rep in self.variables:
            for x, snap in self.axis[rep]:
                obs.append(({**self.values0, rep: x}, snap))
        return obs + self.at(joint)


def bisect(items: list, settled: Callable[[list], bool]) -> None:
    """Group testing: `settled(items)` answers for all of them at once, or they are halved and tried again."""
    if settled(items):
        return
    half = len(items) // 2
    bisect(items[:half], settled)
    bisect(items[half:], settled)


# ------------------------------------------------------------------------------------------------------- flags


def alternatives(info: Field) -> list[Any]:
    """Other values to try for a flag; none for lists, dicts and nulls of no simple type (held as they are:
    structural)."""
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
    return []


def structural_flags(prober: Prober, flags: tuple[Field, ...]) -> tuple[Field, ...]:
    """The flags whose value shapes the model (in the config's order): every alternative changes the build."""
    structural: list[Field] = []
    testable = []
    for info in flags:
        if alternatives(info):
            testable.append(info)
        else:
            structural.append(info)

    def unchanged(group: list[Field], pick: int = 0) -> bool:
        overrides = {}
        for info in group:
            alts = alternatives(info)
            overrides[info.path] = alts[min(pick, len(alts) - 1)]
        snap = prober.probe(overrides)
        return snap is not None and snap.same(prober.anchor)

    def settled(group: list[Field]) -> bool:
        if not group or unchanged(group):
            return True
        if len(group) == 1:
            info = group[0]
            if not any(unchanged(group, pick) for pick in range(1, len(alternatives(info)))):
                structural.append(info)
            return True
        return False

    bisect(testable, settled)
    order = {info.path: i for i, info in enumerate(flags)}
    return tuple(sorted(structural, key=lambda f: order[f.path]))


# ---------------------------------------------------------------------------------------------- integer fields


def candidates(path: str, value: int, ints: dict[str, Field]) -> list[int]:
    """Values to move an integer field to, those keeping the anchor's divisibility relations first."""
    if value <= 0:
        raw = [1, 2, 3, 4]
    elif value == 1:
        raw = [2, 3, 4, 5]
    else:
        raw = [value // 2 if value % 2 == 0 else None, value * 2, value // 3 if value % 3 == 0 else None,
               value * 3, value + 1, value - 1, value * 4, value + 2, value - 2, value * 5]
        if SYMBOL_OF_KEY.get(path.rsplit(".", 1)[-1]) == "K":
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


def design_variations(prober: Prober, ints: dict[str, Field]) -> Design:
    """Which integer fields matter, and two more values along each that keep the model's structure."""
    groups: dict[str, list[str]] = {path: [path] for path in ints}  # representative → members moved with it
    axis: dict[str, list[tuple[int, Snapshot]]] = {}
    independent: list[str] = []
    fixed: list[Field] = []
    # fields with no conventional symbol rarely matter (ep_size, n_group, pooler leftovers): screen them
    # together first, one build for all when none changes a parameter
    suspects = [p for p in ints if p == "num_labels" or p.rsplit(".", 1)[-1] not in SYMBOL_OF_KEY]
    screened = _screen(prober, groups, suspects, ints)
    for path in list(ints):
        if path not in groups:  # already moved with an equal field
            continue
        if path in screened:
            independent.append(path)
            continue
        verdict, found = _axis(prober, groups, path, ints)
        if verdict == "independent":
            independent.append(path)
        elif verdict == "varies":
            axis[path] = found
        elif not _link(prober, groups, path, ints, axis):
            # the tensors themselves change with this field, or it cannot be varied: hold it fixed
            fixed.append(ints[path])
    return Design(groups, axis, tuple(independent), tuple(fixed), {rep: ints[rep].value for rep in groups})


def _screen(prober: Prober, groups, paths: list[str], ints) -> set[str]:
    """The fields among `paths` that change no parameter, found by moving many at once and halving."""
    independent: set[str] = set()

    def settled(batch: list[str]) -> bool:
        if len(batch) < 2:
            return True  # a single field is probed on its own (the same first build, so it is reused)
        overrides: dict[str, int] = {}
        for path in batch:
            overrides.update(_assign(groups, path, candidates(path, ints[path].value, ints)[0]))
        snap = prober.probe(overrides)
        if snap is not None and snap.same(prober.anchor):
            independent.update(batch)
            return True
        return False

    bisect(paths, settled)
    return independent


def _axis(prober: Prober, groups, rep: str, ints) -> tuple[str, list[tuple[int, Snapshot]]]:
    anchor_structure = prober.anchor.structure()
    found: list[tuple[int, Snapshot]] = []
    for x in candidates(rep, ints[rep].value, ints)[:8]:
        snap = prober.probe(_assign(groups, rep, x))
        if snap is None or snap.structure() != anchor_structure:
            continue
        if snap.same(prober.anchor):
            return "independent", []
        found.append((x, snap))
        if len(found) == 2:
            return "varies", found
    return "stuck", found


def _link(prober: Prober, groups, path: str, ints, axis) -> bool:
    """Tie `path` to an equal field when moving both together keeps the structure (embedding = hidden)."""
    value = ints[path].value
    for other in list(groups):
        if other == path or ints[other].value != value:
            continue
        rep, member = (other, path) if rank(other) <= rank(path) else (path, other)
        trial = {r: list(m) for r, m in groups.items()}
        trial[rep] = trial[rep] + trial.pop(member)
        verdict, found = _axis(prober, trial, rep, ints)
        if verdict == "varies":
            groups.clear()
            groups.update(trial)
            axis.pop(member, None)
            axis[rep] = found
            return True
    return False


def _assign(groups: dict[str, list[str]], rep: str, x: int) -> dict[str, int]:
    return {member: x for member in groups.get(rep, [rep])}


# -------------------------------------------------------------------------------------------- joint variations


def joint(prober: Prober, design: Design, *, count: int, seed: int = 0, exclude=()) -> list[Observation]:
    """Random joint variations of all the fields that matter: they separate products from sums."""
    variables = design.variables
    if len(variables) < 2:
        return []
    rng = random.Random(seed)
    anchor_structure = prober.anchor.structure()
    seen = {json.dumps(sorted(a.items())) for a, _ in exclude}
    out = []
    for _ in range(count * 6):
        if len(out) >= count:
            break
        assignment = {}
        for rep in variables:
            values = [design.values0[rep]] + [x for x, _ in design.axis[rep]]
            assignment[rep] = rng.choice(values)
        moved = sum(assignment[rep] != design.values0[rep] for rep in variables)
        key = json.dumps(sorted(assignment.items()))
        if moved < 2 or key in seen:
            continue
        seen.add(key)
        snap = prober.probe(design.overrides(assignment))
        if snap is not None and snap.structure() == anchor_structure:
            out.append((assignment, snap))
    return out
