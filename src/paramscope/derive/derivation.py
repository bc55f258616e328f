"""A derivation in order (class, anchor, fields, flags, integer fields, fit, verification) and what it yields: the
FormulaSpec with its symbols, families and conditions, returned as a frozen Derivation.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import json
import time
from dataclasses import dataclass
from typing import Any

from .. import progress
from ..disk_cache import installed_transformers_version, roles_fingerprint
from ..errors import ModelClassError
from ..formula_spec import ABSENT, Condition, Family, FormulaSpec, factor_order
from ..polynomial import Poly
from .fields import Field, Fields, flat_spellings, rank, read_fields
from .fit import Fit, fit
from .probe import Probe, Prober, Snapshot, Take, build_anchor, parameter_snapshot
from .screen import Design, design_variations, joint, structural_flags
from .verify import nonzero, verify


@dataclass(frozen=True)
class Derivation:
    """What deriving a class's structure at one config yields."""

    spec: FormulaSpec
    values: dict[str, int]  # symbol → its value at the anchor
    class_reason: str  # why this class was chosen (build.choose_class)
    config_class: type  # the transformers config class
    anchor: Snapshot
    anchor_module: Any  # the module built at the anchor config (meta device)
    # families fitted as parameters are, but no parameters: template mode's buffers ("<buffer>") and run lengths
    # ("<run>")
    extra_families: tuple[Family, ...]
    probes: tuple[Probe, ...]  # every config built, the anchor first


def derive_structure(config: dict[str, Any], label: str, *, model_class: str | None, task: str | None,
                     num_labels: int | None, take: Take | None = None, deadline: float | None = None,
                     max_anchor_build_s: float | None = None) -> Derivation:
    """The structure of `config`'s class as a formula in the config's fields, checked against meta builds.

    `take` turns a built module into a snapshot (template mode; by default the parameter families); past `deadline`
    (time.perf_counter()), or when the anchor's build alone takes over `max_anchor_build_s`, the derivation gives
    up with a FormulaError."""
    with progress.status(f"deriving {label}'s structure: builds on meta"):
        return _derive(copy.deepcopy(config), label, model_class, task, num_labels, take, deadline,
                       max_anchor_build_s)


def _derive(base: dict[str, Any], label: str, model_class: str | None, task: str | None, num_labels: int | None,
            take: Take | None, deadline: float | None, max_anchor_build_s: float | None) -> Derivation:
    import transformers

    from ..build import choose_class, make_config, quiet_transformers

    with quiet_transformers():
        config, _ = make_config(base, num_labels=num_labels)
        choice = choose_class(config, base, model_class=model_class, task=task)
        class_name = choice.name
        if getattr(transformers, class_name, None) is None:
            raise ModelClassError(f"formulas need a native transformers class; {class_name!r} is not one")
        flat = flat_spellings(config, base, num_labels)
    snapshot_of = take or parameter_snapshot
    anchor_module, anchor = build_anchor(base, class_name, num_labels, snapshot_of, max_anchor_build_s)
    started = time.perf_counter()  # the derivation proper: the imports and the first build are any build's

    fields = read_fields(config, base, num_labels, flat, template=take is not None)
    prober = Prober(fields, class_name, num_labels, anchor, snapshot_of, deadline)
    flags = structural_flags(prober, fields.flags)
    design = design_variations(prober, fields.ints)
    found = fit(prober, design, joint(prober, design, count=6))

    spec, sym_of, anchor_values, families = _assemble(class_name, fields, flags, design, found)
    _verify_fit(spec, prober, design, sym_of, found)
    anchor_info = {"label": label, "values": anchor_values, "total": anchor.total, "by_role": nonzero(anchor.breakdown),
                   "builds": prober.builds, "seconds": round(time.perf_counter() - started, 3)}
    return Derivation(
        spec=dataclasses.replace(spec, anchor=anchor_info),
        values=anchor_values,
        class_reason=choice.reason,
        config_class=fields.config_class,
        anchor=anchor,
        anchor_module=anchor_module,
        extra_families=tuple(f for f in families if f.role.startswith("<")),
        probes=prober.probes(),
    )


def _assemble(class_name: str, fields: Fields, flags: tuple[Field, ...], design: Design, found: Fit
              ) -> tuple[FormulaSpec, dict[str, str], dict[str, int], tuple[Family, ...]]:
    """(the spec with its anchor left empty, path → symbol, each symbol's value at the anchor, every family fitted:
    template mode's buffers and runs too). A whole-number quotient a // b gets a symbol of its own (Q, Q2, …)."""
    import transformers

    ints, variables = fields.ints, design.variables
    symbols, sym_of = fields.symbols(variables)
    derived: dict[str, tuple[str, str]] = {}
    for name, (a, b) in found.quotients.items():
        free = (f"Q{n}" if n > 1 else "Q" for n in itertools.count(1))
        symbol = next(q for q in free if q not in symbols and q not in derived)
        derived[symbol] = (sym_of[a], sym_of[b])
        sym_of[name] = symbol
    families = tuple(Family(key[0], key[1], *_renamed(comps, sym_of)) for key, comps in found.quantities.items())
    anchor_values = {sym_of[v]: ints[v].value for v in variables}
    anchor_values.update({symbol: anchor_values[a] // anchor_values[b] for symbol, (a, b) in derived.items()})
    spec = FormulaSpec(
        class_name=class_name,
        model_type=str(fields.base.get("model_type")),
        transformers_version=installed_transformers_version() or transformers.__version__,
        roles_fingerprint=roles_fingerprint(),
        symbols=symbols,
        defaults={path: info.default for path, info in ints.items()
                  if isinstance(info.default, int) and not isinstance(info.default, bool)},
        families=tuple(f for f in families if not f.role.startswith("<")),
        conditions=_conditions(fields, flags, design, sym_of, families),
        independent=tuple(sorted((p for p in design.independent if ints[p].present or p != "num_labels"), key=rank)),
        sympy_names=_sympy_names({**symbols, **derived}),
        anchor={},
        aliases=dict(fields.spellings),
        derived=derived,
    )
    return spec, sym_of, anchor_values, families


def _verify_fit(spec: FormulaSpec, prober: Prober, design: Design, sym_of: dict[str, str], found: Fit) -> None:
    """The spec at every build the fit used, then at two fresh joint builds the fit never saw."""
    verify(spec, design, sym_of, design.observations(prober.anchor, found.joint), prober.anchor)
    holdout = joint(prober, design, count=2, seed=1, exclude=found.joint)
    verify(spec, design, sym_of, design.at(holdout), prober.anchor, holdout=True)


def _renamed(comps: list[Poly], sym_of: dict[str, str]) -> tuple[Poly, tuple[Poly, ...]]:
    """(multiplicity, shape) with the field paths replaced by their symbols."""
    renamed = [Poly((tuple((sym_of[name], e) for name, e in mono), coef) for mono, coef in poly.terms.items())
               for poly in comps]
    return renamed[0], tuple(renamed[1:])


def _conditions(fields: Fields, flags: tuple[Field, ...], design: Design, sym_of: dict[str, str],
                families: tuple[Family, ...]) -> tuple[Condition, ...]:
    """The assumptions under which the formula holds: the structural flags (and template mode's unset fields),
    the fields held fixed, the fields tied together, the symbols a config must give, and the whole-number
    quotients."""
    from ..render.formula import format_poly

    out: list[Condition] = []
    for info in (*flags, *fields.unset):
        default = info.default
        if info.value is None:
            out.append(Condition("unset", info.path, None, default,
                                 f"{info.path} is not set (the config class derives it)"))
        elif info.path in fields.periodic:
            length_path, period = fields.periodic[info.path]
            out.append(Condition("periodic", info.path, period, default,
                                 f"{info.path} repeats {json.dumps(period)} over the {length_path} layers"))
        else:
            out.append(Condition("equals", info.path, info.value, default, f"{info.path} = {json.dumps(info.value)}"))
    for info in design.fixed:
        text = f"{info.path} = {info.value} (the set of tensors changes with it)"
        out.append(Condition("equals", info.path, info.value, info.default, text))
    ints = fields.ints
    for rep, members in design.groups.items():
        for member in members[1:]:
            out.append(Condition("same_as", member, rep, ints[member].default,
                                 f"{member} = {rep} (the set of tensors changes when they differ)"))
    for path in design.variables:
        info = ints[path]
        if not isinstance(info.default, int) or isinstance(info.default, bool):
            if path != "num_labels":
                out.append(Condition("present", path, None, ABSENT,
                                     f"{path} is given (left unset, the config class derives it)"))
    order = factor_order(sym_of[v] for v in design.variables)
    seen = set()
    for fam in families:
        for dim in (fam.mult, *fam.shape):
            if dim.has_denominator():
                text = format_poly(dim, order)
                if text not in seen:
                    seen.add(text)
                    out.append(Condition("integral", "", dim.to_json(), None, f"{text} is a whole number"))
    return tuple(out)


def _sympy_names(symbols: dict[str, str]) -> dict[str, str]:
    """How each symbol must be written so that plain `sympy.sympify` reads it as that symbol (N, I, E, S, …)."""
    import sympy

    out = {}
    for name in symbols:
        try:
            ok = sympy.sympify(name) == sympy.Symbol(name)
        except sympy.SympifyError:  # a Python keyword (lambda, if, …): sympify cannot read it as a name
            ok = False
        out[name] = name if ok else f"Symbol('{name}')"
    return out
