"""Terminal rendering with rich: a pure function of (report, width, options) → str."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from ..count import ModuleNode, collapse_runs
from ..frozen import FrozenDict, freeze_fields
from ..explain import exact, fold_names, human, module_arithmetic, role_arithmetic
from ..roles import GROUP_TITLES, role_group
from ._console import indented, percent, to_html, to_text

if TYPE_CHECKING:  # type hints only (counted by tests/test_layout.py all the same)
    from ..report import Component, Report


@dataclass(frozen=True)
class TextOptions:
    width: int = 100
    depth: int = 3
    explain: bool = False
    color: bool = False
    tree: bool = True


@dataclass(frozen=True)
class FormulaLink:
    """What `inspect --explain` shows of the model's closed-form formula (paramscope formula).

    `terms` maps each role to its term (N·(D² + D)); `expression` is the total (P = …). When no formula could
    be had, `note` says why and the rest is empty.
    """

    expression: str = ""
    terms: FrozenDict[str, str] = field(default_factory=FrozenDict)
    note: str = ""  # one line per line of output

    def __post_init__(self) -> None:
        freeze_fields(self, "terms")


def render_text(report: Report, options: TextOptions = TextOptions(), formula: FormulaLink | None = None) -> str:
    return to_text(_parts(report, options, formula), options.width, options.color)


def render_html(report: Report, options: TextOptions = TextOptions(), formula: FormulaLink | None = None) -> str:
    """The text report as HTML with inline styles (Jupyter's display of a Report)."""
    return to_html(_parts(report, options, formula), options.width)


def _parts(report: Report, options: TextOptions, formula: FormulaLink | None = None):
    yield _header(report)
    yield _totals(report)
    if report.conventions:
        yield _conventions(report, options.explain)
    if report.moe is not None:
        yield _moe(report)
    yield _components(report)
    yield _roles(report, options.explain, formula)
    if options.explain and formula is not None:
        yield _formula(formula)
    if report.shared_layers:
        yield _shared(report)
    if report.tied:
        yield _tied(report)
    if report.unclassified:
        yield _names(f"Unclassified ({exact(len(report.unclassified))} tensors, role 'other')", report.unclassified)
    if report.uninitialized:
        yield _names(f"Uninitialised ({exact(len(report.uninitialized))} tensors of lazy modules: no shape before "
                     "the first forward pass, so not counted)", report.uninitialized)
    if options.tree:
        yield _tree(report, options)


def _header(report: Report) -> Group:
    model = report.model
    title = Text.assemble((f"{model.label}", "bold"), " · ", (model.class_name, "bold cyan"))
    lines = [title]
    lines.append(indented(f"{model.source}", 11, "  source"))
    if model.native:
        how = f"native class of transformers {model.transformers_version}"
    else:
        how = "remote code" if model.native is False else "live module"
    lines.append(indented(f"{model.class_name}, {how}", 11, "  class"))
    lines.append(indented(f"{model.class_reason}", 11, "  why"))
    if model.engine == "template":
        detail = f" ({model.engine_detail})" if model.engine_detail else ""
        lines.append(indented("structure template: the recorded skeleton evaluated at this config, no build "
                              f"(--no-cache builds){detail}", 11, "  engine"))
    elif model.engine == "build":
        detail = f" ({model.engine_detail})" if model.engine_detail else ""
        lines.append(indented(f"built on the meta device{detail}", 11, "  engine"))
    if model.model_type:
        lines.append(indented(f"{model.model_type}", 11, "  type"))
    if model.storage is not None:
        lines.append(indented(f"{model.storage.description}", 11, "  storage"))
    for note in model.notes:
        lines.append(indented(f"{note}", 11, "  note"))
    return Group(*lines, Text(""))


def _totals(report: Report) -> Table:
    counts = report.parameters
    table = Table(title="Totals", title_justify="left", box=box.SIMPLE_HEAD, show_header=False, pad_edge=False)
    table.add_column("what")
    table.add_column("exact", justify="right")
    table.add_column("human", justify="right")
    table.add_row("parameters (unique)", exact(counts.total), human(counts.total), style="bold")
    if report.moe is not None:
        if counts.active is None:
            table.add_row("  active per token", "unknown", "", style="bold")
        else:
            table.add_row("  active per token", exact(counts.active), human(counts.active), style="bold")
    table.add_row("  trainable", exact(counts.trainable), human(counts.trainable))
    table.add_row("  frozen", exact(counts.frozen), human(counts.frozen))
    table.add_row("with tied duplicates", exact(counts.with_tied_duplicates), human(counts.with_tied_duplicates))
    table.add_row("buffers (not parameters)", exact(counts.buffers), human(counts.buffers))
    return table


def _conventions(report: Report, explain: bool) -> Table:
    """The counts people quote, by convention; --explain adds each one's definition."""
    table = Table(title="Counts by convention", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False,
                  show_header=explain)
    table.add_column("convention", no_wrap=True)
    table.add_column("parameters", justify="right", no_wrap=True)
    table.add_column("≈", justify="right", no_wrap=True)
    if explain:
        table.add_column("definition", overflow="fold")
    for convention in report.conventions:
        row = [convention.label, exact(convention.value), human(convention.value)]
        table.add_row(*row, *([convention.definition] if explain else []))
    return table


def _moe(report: Report) -> Group:
    """Runs of identical layers as sentences: exact figures must never be cut to fit a column."""
    moe = report.moe
    stacks = sorted({layer.name.rsplit(".", 1)[0] for layer in moe.layers})
    lines = [Text(f"Mixture of experts, per layer ({', '.join(stacks)})", style="bold")]
    for layer, n in moe.runs():
        prefix = "" if len(stacks) == 1 else layer.name.rsplit(".", 1)[0] + "."
        name = f"{prefix}{layer.index}" if n == 1 else f"{prefix}{layer.index}–{layer.index + n - 1}"
        count = f"{n} {layer.kind if layer.kind == 'dense' else 'MoE'} layer{'s' if n > 1 else ''}"
        each = " each" if n > 1 else ""
        if layer.kind == "dense":
            lines.append(indented(f"{count}, {exact(layer.params)}{each}, all active", 10, f"  {name}"))
            continue
        rest = layer.params - layer.routed - layer.shared - layer.router
        parts = [f"routed experts {exact(layer.routed)} ({layer.num_experts} × {exact(layer.per_expert)})"]
        if layer.shared:
            parts.append(f"shared experts {exact(layer.shared)}")
        parts.append(f"router {exact(layer.router)}")
        parts.append(f"attention, norms and the rest {exact(rest)}")
        k = layer.top_k if layer.top_k is not None else "?"
        active = "unknown" if layer.active is None else exact(layer.active)
        lines.append(indented(
            f"{count}, {exact(layer.params)}{each}: {', '.join(parts)}; "
            f"active {active}{each} (top-{k} of {layer.num_experts})", 10, f"  {name}"
        ))
    shared = f", {moe.num_shared_experts} shared" if moe.num_shared_experts else ""
    lines.append(indented(
        f"{len(moe.moe_layers)} MoE and {len(moe.dense_layers)} dense layers; E = {moe.num_experts} routed "
        f"experts{shared}, k = {moe.top_k if moe.top_k is not None else '?'} per token; experts stored as "
        f"{moe.layout}. {moe.source}."
    ))
    if moe.active is not None:
        lines.append(indented(
            f"active per token = {exact(moe.total)} − {exact(moe.inactive)} = {exact(moe.active)}, where active = "
            f"{moe.definition}"
        ))
    return Group(*lines, Text(""))


def _shared(report: Report) -> Group:
    lines = [Text("Shared layers", style="bold")]
    for shared in report.shared_layers:
        lines.append(indented(
            f"{shared.path}: {shared.text} ({shared.how}). The breakdown counts the shared "
            f"{'set' if shared.sets == 1 else 'sets'} once."
        ))
    return Group(*lines, Text(""))


def _components(report: Report) -> Table:
    table = Table(title="Components", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("component")
    table.add_column("type")
    table.add_column("parameters", justify="right")
    table.add_column("share", justify="right")
    table.add_column("≈", justify="right")
    # Numbered parts alike in type and size (a flat Sequential's layers) fold into one row, as in the tree.
    for component, n, step in collapse_runs(report.components, key=_component_key, index=_component_index):
        kind = component.type
        name = component.name
        params = component.params
        if n > 1:
            prefix, _, start = component.name.rpartition(".")
            name = (f"{prefix}." if prefix else "") + _run_name(int(start), n, step)
            kind = f"{exact(n)} × {component.type}, {exact(component.params)} each"
            params = component.params * n
        elif component.repeated:
            layer_type, count, each = component.repeated
            kind = f"{component.type}: {exact(count)} × {layer_type}, {exact(each)} each"
        elif component.shared:
            kind = f"{component.type}: {component.shared}"
        table.add_row(name, kind, exact(params), percent(report.share(params)), human(params))
    table.add_section()
    table.add_row("total", "", exact(report.total), "100.00%", human(report.total), style="bold")
    return table


def _roles(report: Report, explain: bool, formula: FormulaLink | None = None) -> Table:
    table = Table(title="Breakdown by role", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("role")
    table.add_column("parameters", justify="right")
    table.add_column("share", justify="right")
    if explain:
        table.add_column("arithmetic", overflow="fold")
    groups: dict[str, list[tuple[str, int]]] = {}
    for role, count in report.breakdown.items():
        groups.setdefault(role_group(role), []).append((role, count))
    for group, roles in groups.items():
        if len(roles) > 1:
            subtotal = sum(count for _, count in roles)
            row = [GROUP_TITLES.get(group, group), exact(subtotal), percent(report.share(subtotal))]
            table.add_row(*row, *([""] if explain else []), style="bold")
            indent = "  "
        else:
            indent = ""
        for role, count in roles:
            row = [indent + role, exact(count), percent(report.share(count))]
            if explain:
                arithmetic = role_arithmetic(report, role)
                term = formula.terms.get(role) if formula is not None else None
                row.append(f"{term}: {arithmetic}" if term else arithmetic)
            table.add_row(*row)
    table.add_section()
    table.add_row("total", exact(report.total), "100.00%", *([""] if explain else []), style="bold")
    return table


def _formula(formula: FormulaLink) -> Group:
    if not formula.expression:
        return Group(Text(f"Formula: none shown — {formula.note}", style="dim"), Text(""))
    lines = [Text("Formula (the terms in the arithmetic column)", style="bold"),
             indented(f"P = {formula.expression}")]
    lines.extend(indented(line, style="dim") for line in formula.note.splitlines())
    return Group(*lines, Text(""))


def _tied(report: Report) -> Group:
    lines = [Text("Tied weights", style="bold")]
    for group in report.tied:
        aliases = ", ".join(group.aliases)
        lines.append(indented(
            f"{aliases} is the same tensor as {group.canonical} "
            f"({'×'.join(map(str, group.shape))} = {exact(group.numel)}); counted once."
        ))
    extra = report.parameters.with_tied_duplicates - report.parameters.total
    lines.append(indented(
        f"A naive sum over every parameter name counts shared tensors again: "
        f"{exact(report.parameters.with_tied_duplicates)} instead of {exact(report.total)} (+{exact(extra)})."
    ))
    return Group(*lines, Text(""))


_NAME_PATTERNS_SHOWN = 20


def _names(title: str, names: tuple[str, ...]) -> Group:
    """A titled list of tensor names, folded by layer index (`layers.*.x ×32`) and capped."""
    lines = [Text(title, style="bold yellow")]
    folded = fold_names(names)
    for pattern, n in folded[:_NAME_PATTERNS_SHOWN]:
        lines.append(indented(pattern if n == 1 else f"{pattern} ×{exact(n)}"))
    rest = folded[_NAME_PATTERNS_SHOWN:]
    if rest:
        lines.append(indented(f"… and {exact(len(rest))} more patterns ({exact(sum(n for _, n in rest))} tensors)",
                              style="dim"))
    return Group(*lines, Text(""))


def _component_key(component: Component) -> tuple:
    return (component.name.rpartition(".")[0], component.type, component.params, component.repeated,
            component.shared)


def _component_index(component: Component) -> int | None:
    last = component.name.rpartition(".")[2]
    return int(last) if last.isdigit() else None


def _run_name(start: int, n: int, step: int) -> str:
    """Indices of a run: '0–11' when consecutive, '0, 2, …, 9998' when evenly spaced."""
    end = start + (n - 1) * step
    if step == 1:
        return f"{start}–{end}"
    return f"{start}, {end}" if n == 2 else f"{start}, {start + step}, …, {end}"


def _tree(report: Report, options: TextOptions) -> Tree:
    return module_tree(report, options.depth, explain=options.explain)


def module_tree(report: Report, depth: int = 3, *, explain: bool = False, root: str = "") -> Tree:
    """The module tree to `depth` levels below `root` (a module path; "" for the model), runs of identical layers
    folded into one line. Where some parameters train and others do not (a live module with frozen parts, a
    fine-tuning plan), each line says what of it trains, and layers fold only when they train alike."""
    writer = _TreeWriter(report, depth, explain)
    node = writer.find(root)
    tree = Tree(writer.label(node, node.name or node.type if root else node.type, 1), guide_style="dim")
    writer.add_children(tree, node, 1)
    return tree


class _TreeWriter:
    def __init__(self, report: Report, depth: int, explain: bool):
        self.report, self.depth, self.explain = report, depth, explain
        self.params_by_name = {p.name: p for p in report.params}
        self.shared = {s.path: s.text for s in report.shared_layers}
        mixed = report.parameters.trainable and report.parameters.frozen
        self.trainable: dict[int, int] | None = {} if mixed else None

    def find(self, path: str) -> ModuleNode:
        node = self.report.tree
        for part in path.split(".") if path else ():
            node = next((c for c in node.children if c.attr == part), node)
        return node

    def trains(self, node: ModuleNode) -> int | None:
        """Trainable parameters in the subtree (None when the model trains all or nothing), memoised."""
        if self.trainable is None:
            return None
        key = id(node)
        if key not in self.trainable:
            own = sum(p.numel for local in node.own
                      if (p := self.params_by_name.get(f"{node.name}.{local}" if node.name else local)) is not None
                      and p.trainable)
            self.trainable[key] = own + sum(self.trains(c) or 0 for c in node.children if c.back_reference is None)
        return self.trainable[key]

    def add_children(self, branch: Tree, node: ModuleNode, level: int) -> None:
        if level > self.depth:
            return
        # Parameterless modules (activations, dropout) are left out before runs are found, so a Sequential that
        # alternates Linear and ReLU still folds its Linear layers into one line.
        shown = (c for c in node.children if c.params or c.tied or c.back_reference is not None)
        for child, n, step in collapse_runs(shown, key=lambda c: (c.signature, self.trains(c))):
            if child.back_reference is not None:
                branch.add(Text(f"{child.attr} → {child.back_reference or 'the root'} (a cycle back to an enclosing "
                                "module, counted once there)", style="magenta"))
                continue
            runs = self.runs_inside(child) if n == 1 else None
            if runs is not None:
                # A ModuleList that is one run of identical layers reads as one line at its own depth:
                # "layer.0–11: 12 × BertLayer, 7,087,872 each", so the default depth already shows it; layers
                # alike but for what trains read as a line per run ("layer.0–9 … frozen", "layer.10–11 … trains")
                for first, m in runs:
                    name = f"{child.attr}.{_run_name(int(first.attr), m, 1) if m > 1 else first.attr}"
                    sub = branch.add(self.label(first, name, m))
                    self.add_children(sub, first, level + 1)
                continue
            name = _run_name(int(child.attr), n, step) if n > 1 else child.attr
            if child.uses > 1:
                name = f"{name} (also {_index_ranges(child.aliases)})"
            sub = branch.add(self.label(child, name, n))
            self.add_children(sub, child, level + 1)

    def runs_inside(self, node: ModuleNode) -> list[tuple[ModuleNode, int]] | None:
        """The runs of a ModuleList or Sequential whose children are all one structure at consecutive indices:
        one run, or several that differ only in what trains; None otherwise."""
        if node.own or node.tied or node.type not in ("ModuleList", "Sequential"):
            return None
        runs = collapse_runs(node.children, key=lambda c: (c.signature, self.trains(c)))
        alike = len({first.signature for first, _, _ in runs}) == 1
        if alike and sum(n for _, n, _ in runs) > 1 and all(step == 1 and first.uses == 1 for first, _, step in runs):
            return [(first, n) for first, n, _ in runs]
        return None

    def label(self, node: ModuleNode, name: str, n: int) -> Text:
        text = _node_label(node, name, n, self.params_by_name, self.explain, self.shared)
        trains = self.trains(node)
        if trains is not None and node.params:
            if trains == 0:
                text.append("  frozen", style="dim")
            elif trains == node.params:
                text.append("  trains", style="bold green")
            else:
                text.append(f"  {exact(trains)} trainable" + (" each" if n > 1 else ""), style="green")
        return text


def _index_ranges(attrs: tuple[str, ...]) -> str:
    """('1', '2', '3', '5') → '1–3, 5'."""
    if not all(a.isdigit() for a in attrs):
        return ", ".join(attrs)
    numbers = sorted(int(a) for a in attrs)
    parts: list[str] = []
    start = prev = numbers[0]
    for number in numbers[1:] + [None]:
        if number is not None and number == prev + 1:
            prev = number
            continue
        parts.append(str(start) if start == prev else f"{start}–{prev}")
        if number is not None:
            start = prev = number
    return ", ".join(parts)


def _node_label(node: ModuleNode, name: str, n: int, params_by_name, explain: bool,
                shared: dict[str, str] | None = None) -> Text:
    text = Text()
    if n > 1:
        text.append(f"{name}: {exact(n)} × {node.type}, {exact(node.params)} each = {exact(node.params * n)}")
    else:
        text.append(f"{name} ")
        if name != node.type:
            text.append(f"({node.type}) ", style="dim")
        text.append(exact(node.params))
    if shared and node.name in shared:
        text.append(f" — {shared[node.name]}", style="bold")
    for local, canonical in node.tied:
        text.append(f"  [{local} tied to {canonical}]", style="magenta")
    if explain:
        arithmetic = module_arithmetic(node, params_by_name)
        if arithmetic and node.own and not node.children:
            text.append(f"  = {arithmetic}", style="dim")
    return text


def notebook_text(report: Report) -> str:
    """What IPython shows for a Report (display.TEXTS): the terminal report at 110 columns, two levels deep."""
    return render_text(report, TextOptions(width=110, depth=2))
