"""Showing a formula: terminal math (rich), LaTeX, the JSON object, and per-role arithmetic.

Pure functions of a FormulaSpec and the symbols' values. Nothing here imports torch, transformers or sympy,
so a cached formula is shown at the cost of reading one JSON file; rich loads only for the terminal view.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from ..explain import exact, human
from ..formula_spec import FormulaSpec, Group, sympy_spelling
from ..polynomial import Monomial, Poly, mono_degree
from ._console import hanging, wrap_words
from ..frozen import FrozenDict, freeze_fields

_SUPERSCRIPT = str.maketrans("0123456789-", "⁰¹²³⁴⁵⁶⁷⁸⁹⁻")

# What each conventional symbol stands for, for the legend.
DESCRIPTIONS = {
    "V": "vocabulary size", "D": "hidden size", "L": "max positions", "N": "layers", "I": "feed-forward size",
    "T": "token types (segments)", "H": "attention heads", "K": "key/value heads", "E": "experts",
    "C": "labels", "N_dec": "decoder layers", "N_dense": "first dense layers", "E_sh": "shared experts",
    "D_emb": "embedding size (factorised)", "I_dec": "decoder feed-forward size", "I_moe": "expert feed-forward size",
    "I_sh": "shared-expert feed-forward size", "H_dec": "decoder attention heads", "d_h": "head dimension",
    "B": "relative-position buckets", "G": "layer groups", "G_in": "layers per group", "r_q": "query LoRA rank",
    "r_kv": "key/value LoRA rank", "d_rope": "rotary head dimension", "d_nope": "non-rotary head dimension",
    "d_v": "value head dimension", "d_rot": "rotary dimension",
}
# Relations worth pointing out when the config satisfies them: (symbol, in terms of) → how
_RELATIONS = (("I", "D"), ("K", "H"), ("I_moe", "D"))


@dataclass(frozen=True)
class Shown:
    """A formula at one config, and where it came from: what every view renders."""

    spec: FormulaSpec
    values: FrozenDict[str, int]
    label: str
    source: str
    origin: str  # "derived" (here, now) or "cache"
    cache_path: str | None = None
    checked: int | None = None  # the meta-device count at this config, when one was built here
    seconds: float = 0.0

    def __post_init__(self) -> None:
        freeze_fields(self, "values")


# --------------------------------------------------------------------------------------------------- formatting


def format_poly(poly: Poly, order: list[str], style: str = "text", subst: dict[str, int] | None = None) -> str:
    """`poly` as text (V·D + 2·D), LaTeX, or a sympify-able string (each symbol as `sympy_spelling` checks and
    writes it); `subst` writes numbers for symbols."""
    terms = sorted(poly.terms.items(), key=lambda item: -mono_degree(item[0]))
    if not terms:
        return "0"
    minus = "−" if style == "text" else "-"
    out = []
    for i, (mono, coef) in enumerate(terms):
        body = _monomial(mono, abs(coef), order, style, subst)
        if i == 0:
            out.append((minus if coef < 0 else "") + body)
        else:
            out.append((f" {minus} " if coef < 0 else " + ") + body)
    return "".join(out)


def _monomial(mono: Monomial, coef: Fraction, order: list[str], style: str, subst) -> str:
    rank = {s: i for i, s in enumerate(order)}
    factors = sorted(mono, key=lambda item: (rank.get(item[0], len(rank)), item[0]))
    num = [_power(name, e, style, subst) for name, e in factors if e > 0]
    den = [_power(name, -e, style, subst) for name, e in factors if e < 0]
    dot = {"text": "·", "latex": r" \cdot ", "sympy": "*"}[style]
    if coef.numerator != 1 or not num:
        num.insert(0, _number(coef.numerator, style, subst is not None))
    if coef.denominator != 1:
        den.insert(0, _number(coef.denominator, style, subst is not None))
    top = dot.join(num)
    if not den:
        return top
    if style == "latex":
        return rf"\frac{{{top}}}{{{dot.join(den)}}}"
    bottom = den[0] if len(den) == 1 else "(" + dot.join(den) + ")"
    return f"{top}/{bottom}"


def _number(n: int, style: str, grouped: bool) -> str:
    if style == "latex":
        return f"{n:,}".replace(",", "{,}")
    return f"{n:,}" if grouped and style == "text" else str(n)


def _power(name: str, e: int, style: str, subst) -> str:
    if subst is not None:
        base = f"{subst[name]:,}" if style == "text" else str(subst[name])
    elif style == "latex":
        base = latex_symbol(name)
    elif style == "sympy":
        base = sympy_spelling(name)  # never a spelling read from a cache: the name itself, checked
    else:
        base = name
    if e == 1:
        return base
    if style == "latex":
        return f"{base}^{{{e}}}"
    if style == "sympy":
        return f"{base}**{e}"
    return base + str(e).translate(_SUPERSCRIPT)


def latex_symbol(name: str) -> str:
    head, _, sub = name.partition("_")
    if len(head) == 1 and sub:
        return rf"{head}_{{\mathrm{{{sub}}}}}"
    if len(head) == 1:
        return head
    return r"\mathit{" + name.replace("_", r"\_") + "}"


def format_groups(groups: list[Group], order: list[str], style: str = "text",
                  subst: dict[str, int] | None = None) -> str:
    """Σ multiplicity·(per-item sum), e.g. N·(4·D² + 2·D·I + 9·D + I)."""
    dot = {"text": "·", "latex": r" \cdot ", "sympy": "*"}[style]
    left, right = (r"\left(", r"\right)") if style == "latex" else ("(", ")")
    pieces = []
    for mult, inner in groups:
        if mult.constant() == 1:
            pieces.append(format_poly(inner, order, style, subst))
        elif len(mult.terms) == 1 and len(inner.terms) == 1 and subst is None:
            pieces.append(format_poly(mult * inner, order, style, subst))
        else:
            m = format_poly(mult, order, style, subst)
            i = format_poly(inner, order, style, subst)
            if len(mult.terms) > 1:
                m = f"{left}{m}{right}"
            if len(inner.terms) > 1 or subst is not None and not i.replace(",", "").isdigit():
                i = f"{left}{i}{right}"
            pieces.append(f"{m}{dot}{i}")
    if not pieces:
        return "0"
    text = pieces[0]
    minus = "−" if style == "text" else "-"
    for piece in pieces[1:]:
        text += f" {minus} {piece[1:]}" if piece.startswith(minus) else f" + {piece}"
    return text


def substitute(poly: Poly, name: str, replacement: Poly) -> Poly:
    """`poly` with symbol `name` replaced by `replacement` (positive powers only)."""
    out = Poly()
    for mono, coef in poly.terms.items():
        exps = dict(mono)
        e = exps.pop(name, 0)
        if e < 0:
            return poly
        term = Poly.monomial(exps, coef)
        for _ in range(e):
            term = term * replacement
        out = out + term
    return out


def relations(spec: FormulaSpec, values: dict[str, int]) -> list[tuple[str, str, int]]:
    """Relations that hold at this config and simplify the formula: (I, D, 4) means I = 4·D here."""
    out = []
    for a, b in _RELATIONS:
        if a in values and b in values and values[b] and values[a] % values[b] == 0:
            out.append((a, b, values[a] // values[b]))
    return out


def simplified(groups: list[Group], rels: list[tuple[str, str, int]]) -> list[Group]:
    out = []
    for mult, inner in groups:
        for a, b, k in rels:
            inner = substitute(inner, a, Poly.monomial({b: 1}, k))
            mult = substitute(mult, a, Poly.monomial({b: 1}, k))
        out.append((mult, inner))
    return out


def role_terms(spec: FormulaSpec, values: dict[str, int] | None = None) -> dict[str, str]:
    """role → its term (N·(D² + D)), or with `values` its arithmetic (12·(768² + 768)): for `inspect --explain`."""
    return {role: format_groups(groups, spec.order, subst=values) for role, groups in spec.role_groups().items()}


def spelled(spec: FormulaSpec, path: str) -> str:
    """A field with its other spellings, which are the same field: `num_local_experts (or num_experts)`."""
    others = spec.aliases.get(path, ())
    return f"{path} (or {', '.join(others)})" if others else path


def assumption_texts(spec: FormulaSpec) -> list[str]:
    return [cond.text for cond in spec.conditions]


def formula_json(spec: FormulaSpec, values: dict[str, int], value: int) -> dict[str, Any]:
    """The `formula` object of the JSON output. `expression` and `by_role` parse with plain sympy.sympify to symbols
    and numbers only: they hold numbers, + - * / ** ( ), and symbols that `sympy_spelling` checks as it writes
    them. `symbols` maps each to its config path (checked identifiers joined by dots) or its definition (a // b)."""
    return {
        "expression": format_groups(spec.total_groups(), spec.order, "sympy"),
        "symbols": {**spec.symbols, **spec.definitions()},
        "by_role": {role: format_groups(groups, spec.order, "sympy") for role, groups in spec.role_groups().items()},
        "value": value,
        "assumptions": assumption_texts(spec),
    }


def document(shown: Shown) -> dict[str, Any]:
    """The whole JSON document of `paramscope formula --json`."""
    spec = shown.spec
    evaluation = spec.evaluate(shown.values)
    return {
        "schema_version": 1,
        "model": {"source": shown.source, "label": shown.label, "class": spec.class_name,
                  "model_type": spec.model_type, "transformers_version": spec.transformers_version},
        "parameters": {"total": evaluation.total},
        "formula": formula_json(spec, shown.values, evaluation.total),
        "values": dict(shown.values),
        "by_role_values": dict(evaluation.by_role),
        "latex": render_latex(shown),
        "independent_of": list(spec.independent),
        "aliases": {path: list(spec.aliases[path]) for path in spec.symbols.values() if spec.aliases.get(path)},
        "derivation": {
            "origin": shown.origin,
            "cache_file": shown.cache_path,
            "anchor": dict(spec.anchor),
            "meta_count_here": shown.checked,
            "seconds": round(shown.seconds, 3),
        },
    }


# ------------------------------------------------------------------------------------------------------- views


def provenance(shown: Shown) -> list[str]:
    spec = shown.spec
    anchor = spec.anchor
    lines = []
    if shown.origin == "derived":
        lines.append(f"derived   here, from {anchor.get('builds', '?')} meta-device builds in "
                     f"{anchor.get('seconds', shown.seconds):.2f} s (transformers {spec.transformers_version})")
        lines.append(f"verified  formula = meta count at this config ({exact(anchor.get('total', 0))}), at every "
                     "build, at 2 hold-out builds, and per role")
    else:
        lines.append(f"cached    derived at {anchor.get('label')} from {anchor.get('builds', '?')} meta builds and "
                     f"verified there (count {exact(anchor.get('total', 0))}); its assumptions hold here")
        if shown.checked is not None:
            lines.append(f"verified  formula = meta count at this config ({exact(shown.checked)})")
        else:
            lines.append("          answered from the cache without building the model (--verify builds it)")
    if shown.cache_path:
        lines.append(f"file      {shown.cache_path}")
    return lines


Segment = tuple[str, str]  # (text, rich style)


def render_text(shown: Shown, *, width: int = 100, color: bool = False, explain: bool = False) -> str:
    """The terminal view. Columns are laid out here; rich styles them when printing in colour."""
    spec, values = shown.spec, shown.values
    order = spec.order
    evaluation = spec.evaluate(values)
    lines: list[list[Segment]] = []

    def say(*segments: Segment | str) -> None:
        lines.append([(seg, "") if isinstance(seg, str) else seg for seg in segments])

    def heading(title: str, aside: str) -> None:
        """A bold title and a dim aside (" — …"), the aside on lines of its own when both do not fit."""
        if len(title) + len(aside) <= width:
            say((title, "bold"), (aside, "dim"))
            return
        say((title, "bold"))
        for wrapped in hanging("  ", aside.removeprefix(" — "), width):
            say((wrapped, "dim"))

    if len(shown.label) + len(spec.class_name) + 22 <= width:
        say((shown.label, "bold"), " · ", (spec.class_name, "bold cyan"), " · parameter formula")
    else:
        say((shown.label, "bold"))
        say("  ", (spec.class_name, "bold cyan"), " · parameter formula")
    for line in ["source    " + shown.source, *provenance(shown)]:  # "cached    derived at …": a 10-character label
        for wrapped in hanging("  " + line[:10], line[10:], width):
            say((wrapped, ""))
    say()
    for i, chunk in enumerate(_wrap(format_groups(spec.total_groups(), order), width - 4)):
        say((("P = " if i == 0 else "    ") + chunk, "bold"))
    say((f"  = {exact(evaluation.total)}  ({human(evaluation.total)})", "bold"))
    say()

    say(("As the notes lay it out", "bold"))
    rows: list[tuple[list[str], str]] = []
    rels = relations(spec, values)
    for name, groups, value in evaluation.parts:
        rows.append(([name, format_groups(groups, order), exact(value)], ""))
        easier = simplified(groups, rels)
        if rels and easier != groups:
            said = ", ".join(f"{a} = {k}·{b}" if k != 1 else f"{a} = {b}" for a, b, k in rels)
            rows.append((["", f"with {said} (true here): {format_groups(easier, order)}", ""], "dim"))
    rows.append((["total", "", exact(evaluation.total)], "bold"))
    lines.extend(_table(rows, "llr", width, fold=1, rule_before_last=True))
    say()

    heading("By role", " — the figures of `paramscope inspect`, each from its term")
    header = ["role", "term"] + (["arithmetic"] if explain else []) + ["parameters"]
    rows = [(header, "bold")]
    terms, arithmetic = role_terms(spec), role_terms(spec, values) if explain else {}
    for role in spec.role_groups():
        row = [role, terms[role]] + ([arithmetic[role]] if explain else [])
        rows.append((row + [exact(evaluation.by_role[role])], ""))
    rows.append((["total", ""] + ([""] if explain else []) + [exact(evaluation.total)], "bold"))
    lines.extend(_table(rows, "ll" + ("l" if explain else "") + "r", width, fold=len(header) - 2,
                        rule_before_last=True))
    say()

    say(("Legend", "bold"))
    rows = [([symbol, spelled(spec, path), exact(values[symbol]), DESCRIPTIONS.get(symbol, "")], "")
            for symbol, path in spec.symbols.items()]
    rows += [([symbol, definition, exact(values[symbol]), "derived: a whole-number quotient"], "")
             for symbol, definition in spec.definitions().items()]
    lines.extend(_table(rows, "llrl", width, fold=1))
    if spec.independent:
        for wrapped in hanging("  ", "does not depend on: " + ", ".join(spec.independent)
                               + " (varied; no parameter changed)", width):
            say((wrapped, "dim"))
    say()

    assumptions = assumption_texts(spec)
    if assumptions:
        heading("Assumptions", " — a config that breaks one gets a new derivation or an error, never a wrong number")
        for text in assumptions:
            for wrapped in hanging("  · ", text, width):
                say(wrapped)
    return _emit(lines, width, color)


def _wrap(text: str, width: int) -> list[str]:
    """Break a long sum after a ' + ' (or ' − ') so that each line fits `width`."""
    if len(text) <= width or width < 20:
        return [text]
    out, current = [], ""
    for piece in _pieces(text):
        if current and len(current) + len(piece) > width:
            out.append(current.rstrip())
            current = piece.lstrip()
        else:
            current += piece
    if current:
        out.append(current.rstrip())
    return out


def _pieces(text: str) -> list[str]:
    pieces, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += ch == "("
        depth -= ch == ")"
        if depth == 0 and text.startswith((" + ", " − "), i) and i > start:
            pieces.append(text[start:i])
            start = i
    pieces.append(text[start:])
    return pieces


def _table(rows: list[tuple[list[str], str]], aligns: str, width: int, *, fold: int,
           rule_before_last: bool = False) -> list[list[Segment]]:
    """Rows of cells as aligned lines; column `fold` wraps when the table is wider than `width`."""
    ncols = len(aligns)
    widths = [max(len(cells[c]) for cells, _ in rows) for c in range(ncols)]
    gap = 3
    budget = width - 2 - gap * (ncols - 1) - sum(w for c, w in enumerate(widths) if c != fold)
    if widths[fold] > budget:
        widths[fold] = max(budget, 20)
    out: list[list[Segment]] = []
    for index, (cells, style) in enumerate(rows):
        if rule_before_last and index == len(rows) - 1:
            out.append([("  " + "─" * (sum(widths) + gap * (ncols - 1)), "dim")])
        wrapped = [_fold(cell, widths[c]) if c == fold else [cell] for c, cell in enumerate(cells)]
        for k in range(max(len(w) for w in wrapped)):
            parts = []
            for c in range(ncols):
                cell = wrapped[c][k] if k < len(wrapped[c]) else ""
                if c == fold and k > 0:
                    cell = "  " + cell
                parts.append(cell.rjust(widths[c]) if aligns[c] == "r" else cell.ljust(widths[c]))
            out.append([("  " + (" " * gap).join(parts).rstrip(), style)])
    return out


def _fold(text: str, width: int) -> list[str]:
    """A cell in lines of `width`: a sum broken after a ' + ', then anything still too wide between words."""
    return [line for piece in _wrap(text, width)
            for line in (wrap_words(piece, width) if len(piece) > width else [piece])]


def _emit(lines: list[list[Segment]], width: int, color: bool) -> str:
    if not color:
        return "\n".join("".join(text for text, _ in line).rstrip() for line in lines) + "\n"
    from rich.text import Text

    from ._console import to_text

    widest = max((sum(len(text) for text, _ in line) for line in lines), default=width)
    return to_text([Text.assemble(*line) if line else Text("") for line in lines], max(width, widest), color=True)


def render_latex(shown: Shown) -> str:
    spec, values = shown.spec, shown.values
    order = spec.order
    evaluation = spec.evaluate(shown.values)

    def number(n: int) -> str:
        return f"{n:,}".replace(",", "{,}")

    def text(name: str) -> str:
        return r"\text{" + name.replace("_", r"\_") + "}"

    lines = [f"% paramscope formula: {shown.label}, {spec.class_name} (transformers {spec.transformers_version})",
             r"\begin{align*}",
             rf"P &= {format_groups(spec.total_groups(), order, 'latex')} \\",
             rf"  &= {number(evaluation.total)} \\[4pt]"]
    parts = [rf"{text(name)} &= {format_groups(groups, order, 'latex')} && {number(value)}"
             for name, groups, value in evaluation.parts]
    lines += [" \\\\\n".join(parts), r"\end{align*}", r"\begin{align*}"]
    roles = [rf"{text(role)} &= {format_groups(groups, order, 'latex')} && {number(evaluation.by_role[role])}"
             for role, groups in spec.role_groups().items()]
    lines += [" \\\\\n".join(roles), r"\end{align*}"]
    legend = ", ".join(rf"${latex_symbol(s)}$ = \texttt{{{p.replace('_', chr(92) + '_')}}} = {number(values[s])}"
                       for s, p in {**spec.symbols, **spec.definitions()}.items())
    lines.append(f"where {legend}.")
    lines += [f"% assumes: {assumption}" for assumption in assumption_texts(spec)]
    return "\n".join(lines) + "\n"
