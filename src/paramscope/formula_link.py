"""The link from a report to its model's closed-form formula, which `inspect --explain` shows beside each role.

Nothing heavy is imported at module level: a cached formula needs neither sympy nor a second meta build.
"""

from __future__ import annotations

from .errors import ParamscopeError


def formula_link(source, report, *, num_labels: int | None, name_class: bool = False):
    """For `inspect --explain`: each role's term in the model's formula (cached, or derived once and cached).

    A formula that cannot be had, or that disagrees with the report's count, becomes a note in the output,
    never a failure of `inspect` itself.
    """
    from .render.formula import format_groups, role_terms
    from .render.text import FormulaLink

    if report.model.source_kind == "module":
        return None
    from .formula_cache import lookup

    # A cached formula is checked against this very report (total and every role): no second meta build.
    hit = lookup(source.config, model_class=report.model.class_name, num_labels=num_labels)
    if hit.spec is not None:
        spec, values, how = hit.spec, hit.values, "from the formula cache"
    else:
        import copy

        from .formula import formula_for

        try:
            formula = formula_for(copy.deepcopy(source.config), label=source.label, source=source.description,
                                  model_class=report.model.class_name, num_labels=num_labels)
        except ParamscopeError as err:
            return FormulaLink(note=f"no closed-form formula for {report.model.class_name}: {err}")
        spec, values = formula.spec, formula.values
        how = ("derived now and cached" if formula.cache_path
               else "derived now (not cached: the cache directory could not be written)")
    evaluation = spec.evaluate(values)
    roles = {role: n for role, n in evaluation.by_role.items() if n}
    if evaluation.total != report.total or roles != {role: n for role, n in report.breakdown.items() if n}:
        return FormulaLink(note=f"the formula gives {evaluation.total:,} but the model has {report.total:,} (or a "
                                "role differs); please report this as a paramscope bug")
    command = f"paramscope formula {report.model.label}"
    if name_class:
        command += f" --class {report.model.class_name}"
    if num_labels is not None:
        command += f" --num-labels {num_labels}"
    legend = ", ".join(f"{symbol} = {values[symbol]:,}" for symbol in spec.symbols if symbol in values)
    return FormulaLink(
        expression=format_groups(spec.total_groups(), spec.order),
        terms=role_terms(spec),
        note=f"{legend}\n{how}, and checked against this build\n"
             f"`{command}` gives the legend and the assumptions",
    )
