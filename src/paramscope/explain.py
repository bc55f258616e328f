"""Arithmetic behind each figure, as text a learner can check by hand: 768×768 + 768 = 590,592."""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Iterable

from .count import LAYER_INDEX, ModuleNode, ParameterInfo, index_pattern

if TYPE_CHECKING:  # type hints only (counted by tests/test_layout.py all the same)
    from .report import Report



def exact(n: int) -> str:
    return f"{n:,}"


def human(n: int) -> str:
    """109482240 → '109.48 M'; 1538 → '1.54 K'; small counts stay exact."""
    for scale, unit in ((10**12, "T"), (10**9, "B"), (10**6, "M"), (10**3, "K")):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return str(n)


def fold_names(names: Iterable[str]) -> list[tuple[str, int]]:
    """Names that differ only in layer indices as one (pattern, count), in order of first appearance:
    32 layers' `layers.0.x` … `layers.31.x` become ('layers.*.x', 32); a name alone in its pattern stays as it is."""
    first: dict[str, str] = {}
    counts: dict[str, int] = {}
    for name in names:
        pattern = index_pattern(name)
        first.setdefault(pattern, name)
        counts[pattern] = counts.get(pattern, 0) + 1
    return [(pattern if n > 1 else first[pattern], n) for pattern, n in counts.items()]


def shape_term(shape: tuple[int, ...]) -> str:
    return "×".join(str(d) for d in shape) if shape else "1"


def sum_of_shapes(params: list[ParameterInfo]) -> str:
    """'768×768 + 768 = 590,592' for one set of tensors."""
    terms = " + ".join(shape_term(p.shape) for p in params)
    value = sum(p.numel for p in params)
    if len(params) == 1 and len(params[0].shape) <= 1:
        return exact(value)
    return f"{terms} = {exact(value)}"


def role_arithmetic(report: Report, role: str) -> str:
    """How the role's total arises: per-layer terms × layer count, plus any one-off tensors."""
    layered: dict[str, list[ParameterInfo]] = defaultdict(list)
    single: list[ParameterInfo] = []
    for param in report.by_role(role):
        match = LAYER_INDEX.search(param.name)
        if match:
            layered[match.group(1)].append(param)
        else:
            single.append(param)
    parts = []
    if layered:
        shapes_per_layer = {tuple(p.shape for p in ps) for ps in layered.values()}
        if len(shapes_per_layer) == 1:
            one = next(iter(layered.values()))
            per_layer = sum(p.numel for p in one)
            n = len(layered)
            inner = sum_of_shapes(one)
            if n == 1:
                parts.append(inner)
            else:
                parts.append(f"{inner} per layer × {n} = {exact(per_layer * n)}")
        else:
            total = sum(p.numel for ps in layered.values() for p in ps)
            parts.append(f"{len(layered)} layers of differing shapes = {exact(total)}")
    if single:
        parts.append(sum_of_shapes(single))
    return "; ".join(parts)


def module_arithmetic(node: ModuleNode, params_by_name: dict[str, ParameterInfo]) -> str:
    """The module's own tensors, e.g. a Linear's '768×768 + 768 = 590,592'."""
    own = [params_by_name[f"{node.name}.{local}" if node.name else local] for local in node.own]
    return sum_of_shapes(own) if own else ""
