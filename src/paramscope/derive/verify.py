"""Checking a formula against meta builds: a derived one at every build it was fitted to, at fresh hold-outs and per
role at the anchor; a cached one at the config it answers for. Any disagreement is a FormulaMismatchError.
"""

from __future__ import annotations

from typing import Any

from ..errors import FormulaMismatchError
from ..formula_spec import FormulaSpec
from .probe import Snapshot, count_build
from .screen import Design, Observation


def nonzero(mapping: dict[str, int]) -> dict[str, int]:
    return {k: v for k, v in mapping.items() if v}


def verify(spec: FormulaSpec, design: Design, sym_of: dict[str, str], observations: list[Observation],
           anchor: Snapshot, *, holdout: bool = False) -> None:
    """The derived `spec` gives each observed build's total, and the anchor's split by role."""
    variables = design.variables
    for assignment, snap in observations:
        values = {sym_of[rep]: assignment[rep] for rep in variables}
        evaluation = spec.evaluate(values)
        if evaluation.total != snap.total:
            where = ", ".join(f"{rep}={assignment[rep]}" for rep in variables
                              if assignment[rep] != design.values0[rep])
            raise FormulaMismatchError(
                f"the derived formula for {spec.class_name} gives {evaluation.total:,} but the meta build counts "
                f"{snap.total:,} at {where or 'the given config'}"
                f"{' (a hold-out build)' if holdout else ''}: a paramscope bug, please report it"
            )
    values = {sym_of[rep]: design.values0[rep] for rep in variables}
    by_role = spec.evaluate(values).by_role
    if nonzero(by_role) != nonzero(anchor.breakdown):
        raise FormulaMismatchError(
            f"the derived formula's split by role for {spec.class_name} disagrees with the meta count: "
            "a paramscope bug, please report it"
        )


def check_cached(spec: FormulaSpec, config: dict[str, Any], values: dict[str, int], num_labels: int | None) -> int:
    """One meta build at `config`: the cached formula must give its count exactly, per role too; the count."""
    counted = count_build(config, spec.class_name, num_labels)
    evaluation = spec.evaluate(values)
    if evaluation.total != counted.counts.total or nonzero(evaluation.by_role) != nonzero(counted.breakdown):
        raise FormulaMismatchError(
            f"cached formula for {spec.class_name} gives {evaluation.total:,} but the meta build counts "
            f"{counted.counts.total:,}: a paramscope bug, please report it (rerun with use_cache=False to re-derive)"
        )
    return counted.counts.total
