"""Closed-form parameter formulas, derived from the config for any model class, and checked.

`derive_formula` and `formula_for` answer with a `Formula` whose `expression` is a sympy expression: from the
cache (formula_cache.lookup, the path `paramscope formula` answers by) when a formula derived before holds there,
without a build (`verify=True` checks it with one meta build, as `--verify` does); otherwise derived from meta
builds (derive/, whose docstring walks through the steps: nothing is fitted to one point) and stored.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from typing import Any

from .derive.derivation import derive_structure
from .derive.verify import check_cached
from .disk_cache import route_key
from .errors import AssumptionError, FormulaError, FormulaMismatchError, ModelClassError
from .formula_cache import lookup, store
from .formula_spec import FormulaSpec
from .polynomial import Poly
from .frozen import FrozenDict, freeze_fields

__all__ = ["Formula", "derive_formula", "formula_for", "AssumptionError", "FormulaError", "FormulaMismatchError"]


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
        """One line of at most REPR_LIMIT characters: a long formula (a multimodal model's) keeps its leading terms
        and says `+ …`; IPython's text display, `str(formula.expression)` and `_repr_latex_` give it whole."""
        return self._line(REPR_LIMIT)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:  # IPython's text display: the whole formula
        printer.text(self._line(None))

    def _line(self, limit: int | None) -> str:
        from .render.formula import format_groups

        head, tail = f"<Formula {self.class_name}: P = ", f" = {self.value:,}>"
        expression = format_groups(self.spec.total_groups(), self.spec.order)
        if limit is not None and len(head) + len(expression) + len(tail) > limit:
            expression = _leading_terms(expression, limit - len(head) - len(tail))
        return head + expression + tail

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
                   num_labels: int | None = None, use_cache: bool = True, revision: str | None = None,
                   verify: bool = False) -> Formula:
    """The parameter count of `model` as a polynomial in its config's fields, verified against meta builds.

    `model` is anything `paramscope.inspect` takes except a live module: a preset name, a config.json path, a
    model directory, a hub id, a config dict or a PretrainedConfig. With `use_cache`, a formula derived
    before whose assumptions hold is answered from the cache without building the model, as `paramscope formula`
    answers (the entry reproduces its own anchor before use); `verify=True` also builds the model on meta and
    compares, as `--verify` does (`checked` is then that count). A new formula is stored.
    """
    config, label, source = _resolve(model, revision)
    return formula_for(config, label=label, source=source, model_class=model_class, task=task,
                       num_labels=num_labels, use_cache=use_cache, verify=verify)


def formula_for(config: dict[str, Any], *, label: str, source: str, model_class: str | None = None,
                task: str | None = None, num_labels: int | None = None, use_cache: bool = True,
                verify: bool = False) -> Formula:
    """derive_formula for a config dict already read (the CLI's path after a cache miss, or with --verify)."""
    from .build import check_num_labels, validate_config_dict

    started = time.perf_counter()
    check_num_labels(num_labels)  # as the CLI checks them, before the cache is read
    validate_config_dict(config)
    if use_cache:
        hit = lookup(config, model_class=model_class, task=task, num_labels=num_labels)
        if hit.spec is not None:
            checked = check_cached(hit.spec, config, hit.values, num_labels) if verify else None
            return _make_formula(hit.spec, hit.values, label=label, source=source, origin="cache",
                                 cache_path=str(hit.path), checked=checked,
                                 seconds=time.perf_counter() - started)
    derivation = derive_structure(config, label, model_class=model_class, task=task, num_labels=num_labels)
    spec, values = derivation.spec, derivation.values
    path = None
    if use_cache:
        stored = store(spec, route=route_key(config, model_class=model_class, task=task))
        path = str(stored) if stored else None
    return _make_formula(spec, values, label=label, source=source, origin="derived", cache_path=path,
                         checked=spec.anchor["total"], seconds=time.perf_counter() - started)


REPR_LIMIT = 300  # characters of a Formula's repr


def _leading_terms(expression: str, room: int) -> str:
    """The expression's leading top-level terms that fit in `room` characters with " + …" after them."""
    cuts, depth = [], 0
    for i, char in enumerate(expression):
        depth += char in "([{"
        depth -= char in ")]}"
        if depth == 0 and expression[i:i + 3] in (" + ", " − "):
            cuts.append(i)
    kept = [cut for cut in cuts if cut + len(" + …") <= room]
    return expression[:kept[-1]] + " + …" if kept else expression[:max(room - 1, 0)] + "…"


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


# ---------------------------------------------------------------------------------------------------- inputs


def _resolve(model: Any, revision: str | None) -> tuple[dict[str, Any], str, str]:
    """(config dict, label, description) for what `paramscope.inspect` accepts, except a live module."""
    from .api import is_module, as_source

    if is_module(model):
        raise ModelClassError("a formula is derived from a config; a live module has no config fields to vary")
    source = as_source(model, revision)
    return copy.deepcopy(source.config), source.label, source.description


def _config_dict(config: Any) -> dict[str, Any]:
    return _resolve(config, None)[0]
