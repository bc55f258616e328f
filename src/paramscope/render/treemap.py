"""Treemaps of a report as plain data: boxes with exact values, hover arithmetic and a colour key. No plotting here.

Two views of the same parameters:

- by module: the module tree, where a run of identical layers is one box "layer.0–11 × 12" whose parts are the
  parts of one layer, each worth n × its per-layer count (the hover says so: "590,592 per layer × 12");
- by role: role group → role → tensor family ("encoder.layer.*.attention.self.query.weight × 12").

Every box's value is the sum of its children's, and the leaves sum to the report's unique total: a tied tensor is
counted once, under its canonical owner, and the boxes that hold its other names are marked instead. The renderer
(render.html) only draws these boxes.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from ..count import ModuleNode, ParameterInfo, collapse_runs, index_pattern
from ..explain import exact, human, role_arithmetic, shape_term, sum_of_shapes
from ._console import percent as _percent
from ..roles import GROUP_TITLES, role_group

if TYPE_CHECKING:  # type hints only (counted by tests/test_layout.py all the same)
    from ..report import Report

# Beyond this many boxes a browser slows down and the file grows; deeper levels are then folded into their parent.
MAX_BOXES = 4_000
# Tensor families shown per role in the role view; the rest is one box.
MAX_FAMILIES_PER_ROLE = 24


@dataclass(frozen=True)
class Box:
    id: str  # unique in its treemap; "" is never used (plotly's root has parent "")
    parent: str  # the parent box's id, "" for the root
    label: str  # what the box says
    value: int  # parameters inside: the sum of the children's values when there are children
    hover: str  # exact count, share and arithmetic, lines joined by "<br>"
    group: str  # the role group that holds most of its parameters: it picks the colour
    emphasis: float = 1.0  # 0–1: active-per-token share (MoE) or trainable share (plans); pale when low
    tied: bool = False  # holds a tensor that other names share (or is such a name)


@dataclass(frozen=True)
class Treemap:
    title: str
    total: int  # the leaves' sum
    boxes: tuple[Box, ...]  # parents before children
    emphasis: str | None = None  # what pale means, e.g. "inactive per token", None when nothing is pale

    @property
    def leaves(self) -> tuple[Box, ...]:
        parents = {box.parent for box in self.boxes}
        return tuple(box for box in self.boxes if box.id not in parents)

    @property
    def groups(self) -> tuple[str, ...]:
        """Role groups in the colour key, largest first."""
        sizes: Counter[str] = Counter()
        for leaf in self.leaves:
            sizes[leaf.group] += leaf.value
        return tuple(group for group, _ in sizes.most_common())


# --- what full colour means: a share per tensor (active per token, trainable, changed) --------------------------

@dataclass(frozen=True)
class Emphasis:
    """Boxes are in full colour where `share` is 1 and pale where it is 0; the hovers and the key say what it means."""

    share: Callable[[ParameterInfo], float]  # 0–1 per tensor
    bright: str  # what the counted part is, in hovers: "active per token", "trainable", "changed"
    pale: str  # what pale means, under the chart


TRAINABLE = Emphasis(lambda param: 1.0 if param.trainable else 0.0, "trainable",
                     "frozen: no gradient, no optimizer state")


def changed(names: set[str], what: str) -> Emphasis:
    """The tensors named (a diff's added, removed or reshaped ones) in full colour, the rest pale."""
    return Emphasis(lambda param: 1.0 if param.name in names else 0.0, what, "unchanged")


def active_share(report: Report) -> Emphasis | None:
    """Per tensor, the share of its parameters a token uses: k/E for routed experts, 1 elsewhere. None when the model
    is dense or k is unknown (nothing is pale then)."""
    moe = report.moe
    if moe is None or moe.active is None:
        return None
    by_layer = {layer.name: layer for layer in moe.moe_layers}

    def share(param: ParameterInfo) -> float:
        if param.role != "moe.experts":
            return 1.0
        for name, layer in by_layer.items():
            if param.name.startswith(name + ".") and layer.num_experts and layer.top_k is not None:
                return layer.top_k / layer.num_experts
        return 1.0

    return Emphasis(share, "active per token", "inactive per token (routed experts: a token uses k of E)")


# --- by module --------------------------------------------------------------------------------------------------

def module_treemap(report: Report, emphasis: Emphasis | None = None, max_boxes: int = MAX_BOXES) -> Treemap:
    """The module tree as boxes. With `emphasis` (active_share, TRAINABLE, changed), boxes are pale where it is
    low."""
    params = {p.name: p for p in report.params}
    tied_names = {alias for group in report.tied for alias in group.aliases} | {g.canonical for g in report.tied}
    depth = None
    while True:
        builder = _ModuleBoxes(report, params, tied_names, emphasis, depth)
        boxes = builder.build()
        if len(boxes) <= max_boxes or depth == 1:
            break
        depth = builder.deepest - 1 if depth is None else depth - 1
    return Treemap(f"Parameters by module: {report.model.class_name}", report.total, tuple(boxes),
                   None if emphasis is None else emphasis.pale)


class _ModuleBoxes:
    def __init__(self, report: Report, params: dict[str, ParameterInfo], tied_names: set[str],
                 emphasis: Emphasis | None, max_depth: int | None):
        self.report = report
        self.params = params
        self.tied_names = tied_names
        self.emphasis = emphasis
        self.max_depth = max_depth
        self.boxes: list[Box] = []
        self.deepest = 0
        self._subtree: dict[int, tuple[Counter, float]] = {}

    def build(self) -> list[Box]:
        root = self.report.tree
        self._add(root, "", root.type, "", "", 1, 0)
        return self.boxes

    # Each call adds the box of `node` (times `n` when it stands for a run of n identical layers) and its children.
    def _add(self, node: ModuleNode, box_id: str, label: str, parent: str, path: str, n: int, depth: int) -> None:
        """`path` is the dotted path as shown, with a run's indices as a range: encoder.layer.0–11.attention."""
        self.deepest = max(self.deepest, depth)
        groups, active = self._summary(node)
        children = [c for c in node.children if c.params and c.back_reference is None]
        value = node.params * n
        self.boxes.append(Box(
            id=box_id or node.type, parent=parent, label=label, value=value,
            hover=self._hover(node, path, n), group=groups.most_common(1)[0][0] if groups else "other",
            emphasis=active / node.params if node.params else 1.0, tied=self._is_tied(node),
        ))
        box_id = box_id or node.type
        if not children or (self.max_depth is not None and depth >= self.max_depth):
            return
        own = node.params - sum(c.params for c in children)
        if own:
            own_params = self._own_params(node)
            self.boxes.append(Box(
                id=f"{box_id}/(own)", parent=box_id, label=f"{label or node.type}: own tensors", value=own * n,
                hover=self._own_hover(node, path, own_params, own, n), group=_dominant(own_params),
                emphasis=_emphasis(own_params, self.emphasis),
                tied=any(p.name in self.tied_names for p in own_params),
            ))
        for child, count, step in collapse_runs(children, key=self._alike):
            if count > 1:
                first, name, m = child, _range(int(child.attr), count, step), count
            else:
                first, name, m = child, child.attr, 1
            first, name, m = _descend(first, name, m, self._alike)
            label = f"{name} × {m}" if m > 1 else name
            self._add(first, f"{box_id}/{name}", label, box_id, _full(path, name), n * m, depth + 1)

    def _alike(self, node: ModuleNode) -> tuple:
        """Layers fold into one "× n" box when they are the same structure with the same emphasis: the last two
        layers that train stay apart from the frozen ten before them."""
        _, active = self._summary(node)
        return node.signature, round(active / node.params, 9) if node.params else 1.0

    def _summary(self, node: ModuleNode) -> tuple[Counter, float]:
        """(parameters per role group, parameters weighted by emphasis) of the subtree, memoised per node."""
        key = id(node)
        if key not in self._subtree:
            groups: Counter[str] = Counter()
            active = 0.0
            for local in node.own:
                param = self.params.get(_full(node.name, local))
                if param is None:
                    continue
                groups[role_group(param.role)] += param.numel
                active += param.numel * (self.emphasis.share(param) if self.emphasis else 1.0)
            for child in node.children:
                if child.back_reference is None:
                    child_groups, child_active = self._summary(child)
                    groups.update(child_groups)
                    active += child_active
            self._subtree[key] = (groups, active)
        return self._subtree[key]

    def _own_params(self, node: ModuleNode) -> list[ParameterInfo]:
        """The counted tensors the module itself holds (its own, canonical names)."""
        names = (_full(node.name, local) for local in node.own)
        return [self.params[name] for name in names if name in self.params]

    def _is_tied(self, node: ModuleNode) -> bool:
        return bool(node.tied) or any(_full(node.name, local) in self.tied_names for local in node.own)

    def _hover(self, node: ModuleNode, path: str, n: int) -> str:
        lines = [f"<b>{path or node.type}</b> ({node.type})"]
        own_params = self._own_params(node)
        if own_params and node.params == sum(p.numel for p in own_params):  # a leaf module: its tensors' shapes
            lines.append(_sum_of_shapes(own_params, n))
        elif n > 1:
            lines.append(f"{exact(node.params)} per layer × {n} = {exact(node.params * n)}")
        else:
            lines.append(f"{exact(node.params)} parameters")
        lines.append(f"{_percent(self.report.share(node.params * n))} of {exact(self.report.total)}")
        lines.extend(self._tied_lines(node))
        if self.emphasis is not None and node.params:
            _, active = self._summary(node)
            if round(active) != node.params:
                lines.append(f"{exact(round(active * n))} {self.emphasis.bright} ({_percent(active / node.params)})")
        return "<br>".join(lines)

    def _own_hover(self, node: ModuleNode, path: str, own_params: list[ParameterInfo], own: int, n: int) -> str:
        lines = [f"<b>{path or node.type}</b>: its own tensors ({', '.join(node.own)})",
                 _sum_of_shapes(own_params, n) if own_params else f"{exact(own)} parameters",
                 f"{_percent(self.report.share(own * n))} of {exact(self.report.total)}"]
        return "<br>".join(lines)

    def _tied_lines(self, node: ModuleNode) -> list[str]:
        lines = [f"{local} is tied to {canonical}: counted once, there" for local, canonical in node.tied]
        for local in node.own:
            name = _full(node.name, local)
            for group in self.report.tied:
                if group.canonical == name:
                    lines.append(f"{local} is shared with {', '.join(group.aliases)}: counted once, here")
        return lines


def _descend(node: ModuleNode, name: str, n: int, alike) -> tuple[ModuleNode, str, int]:
    """Follow a chain of modules that only wrap one part (BertEncoder → layer → 12 × BertLayer), so that the box
    says "encoder.layer.0–11 × 12" and the treemap spends no level on wrappers: (node, dotted name, run length)."""
    while not node.own:
        run = _single_run(node, alike)
        if run is not None:
            first, m = run
            node, name, n = first, f"{name}.{_range(int(first.attr), m, 1)}", n * m
            continue
        kids = [c for c in node.children if c.params and c.back_reference is None]
        if len(kids) != 1 or kids[0].uses != 1 or kids[0].params != node.params:
            break
        node, name = kids[0], f"{name}.{kids[0].attr}"
    return node, name, n


def _single_run(node: ModuleNode, alike) -> tuple[ModuleNode, int] | None:
    """A ModuleList/Sequential that is exactly one run of identical, unshared layers: (first layer, count)."""
    if node.own or node.tied or node.type not in ("ModuleList", "Sequential"):
        return None
    runs = collapse_runs((c for c in node.children if c.params), key=alike)
    if len(runs) == 1 and runs[0][1] > 1 and runs[0][2] == 1 and runs[0][0].uses == 1 and node.params == (
            runs[0][0].params * runs[0][1]):
        return runs[0][0], runs[0][1]
    return None


# --- by role ----------------------------------------------------------------------------------------------------

def role_treemap(report: Report, emphasis: Emphasis | None = None) -> Treemap:
    """Role group → role → tensor family, each family folded over layer indices."""
    root = report.model.class_name
    boxes = [Box(root, "", root, report.total, _hover_lines(root, report.total, report), _dominant(report.params),
                 _emphasis(report.params, emphasis))]
    by_group: dict[str, dict[str, list[ParameterInfo]]] = {}
    for param in report.params:
        by_group.setdefault(role_group(param.role), {}).setdefault(param.role, []).append(param)
    tied_names = {g.canonical for g in report.tied}
    for group, roles in sorted(by_group.items(), key=lambda item: -sum(p.numel for ps in item[1].values()
                                                                        for p in ps)):
        members = [p for ps in roles.values() for p in ps]
        group_id = f"{root}/{group}"
        value = sum(p.numel for p in members)
        boxes.append(Box(group_id, root, GROUP_TITLES.get(group, group), value,
                         _hover_lines(GROUP_TITLES.get(group, group), value, report), group,
                         _emphasis(members, emphasis), any(p.name in tied_names for p in members)))
        for role, params in sorted(roles.items(), key=lambda item: -sum(p.numel for p in item[1])):
            role_id = f"{group_id}/{role}"
            value = sum(p.numel for p in params)
            hover = _hover_lines(role, value, report) + "<br>" + role_arithmetic(report, role)
            boxes.append(Box(role_id, group_id, role, value, hover, group, _emphasis(params, emphasis),
                             any(p.name in tied_names for p in params)))
            boxes.extend(_families(report, role_id, params, group, emphasis, tied_names))
    return Treemap(f"Parameters by role: {report.model.class_name}", report.total, tuple(boxes),
                   None if emphasis is None else emphasis.pale)


def _families(report: Report, parent: str, params: list[ParameterInfo], group: str, emphasis, tied_names
              ) -> list[Box]:
    members: dict[str, list[ParameterInfo]] = {}
    for pattern, param in zip(_family_patterns(params), params):
        members.setdefault(pattern, []).append(param)
    families = sorted(members.items(), key=lambda item: -sum(p.numel for p in item[1]))
    shown, rest = families[:MAX_FAMILIES_PER_ROLE], families[MAX_FAMILIES_PER_ROLE:]
    if len(shown) == 1 and not rest:  # a role of one family: the role's box is the leaf
        return []
    boxes = []
    for pattern, ps in shown:
        value = sum(p.numel for p in ps)
        shapes = {p.shape for p in ps}
        if len(ps) > 1 and len(shapes) == 1:
            arithmetic = f"{shape_term(ps[0].shape)} = {exact(ps[0].numel)} × {len(ps)} = {exact(value)}"
        elif len(ps) == 1:
            arithmetic = f"{shape_term(ps[0].shape)} = {exact(value)}"
        else:
            arithmetic = f"{len(ps)} tensors of differing shapes = {exact(value)}"
        label = pattern if len(ps) == 1 else f"{pattern} × {len(ps)}"
        tied = any(p.name in tied_names for p in ps)
        hover = f"<b>{pattern}</b> ({ps[0].dtype})<br>{arithmetic}<br>{_percent(report.share(value))} of " \
                f"{exact(report.total)}" + ("<br>tied: other names share it, counted once" if tied else "")
        boxes.append(Box(f"{parent}/{pattern}", parent, label, value, hover, group, _emphasis(ps, emphasis), tied))
    if rest:
        ps = [p for _, family in rest for p in family]
        value = sum(p.numel for p in ps)
        boxes.append(Box(f"{parent}/…", parent, f"{len(rest)} more families", value,
                         _hover_lines(f"{len(rest)} more tensor families", value, report), group,
                         _emphasis(ps, emphasis)))
    return boxes


def _family_patterns(params: list[ParameterInfo]) -> list[str]:
    """Each tensor's family pattern (layer indices as *), as explain.fold_names names them: a tensor alone in its
    pattern keeps its own name."""
    patterns = [index_pattern(p.name) for p in params]
    counts = Counter(patterns)
    return [pattern if counts[pattern] > 1 else p.name for pattern, p in zip(patterns, params)]


# --- helpers ----------------------------------------------------------------------------------------------------

def _full(prefix: str, local: str) -> str:
    return f"{prefix}.{local}" if prefix else local


def _range(start: int, n: int, step: int) -> str:
    end = start + (n - 1) * step
    if step == 1:
        return f"{start}–{end}"
    return f"{start},{start + step},…,{end}"


def _dominant(params) -> str:
    groups: Counter[str] = Counter()
    for param in params:
        groups[role_group(param.role)] += param.numel
    return groups.most_common(1)[0][0] if groups else "other"


def _emphasis(params, emphasis) -> float:
    total = sum(p.numel for p in params)
    if emphasis is None or not total:
        return 1.0
    return sum(p.numel * emphasis.share(p) for p in params) / total


def _sum_of_shapes(params: list[ParameterInfo], n: int) -> str:
    """explain.sum_of_shapes, times the run length: '768×768 + 768 = 590,592 per layer × 12 = 7,087,104'."""
    each = sum_of_shapes(params)
    return f"{each} per layer × {n} = {exact(sum(p.numel for p in params) * n)}" if n > 1 else each


def _hover_lines(title: str, value: int, report: Report) -> str:
    return f"<b>{title}</b><br>{exact(value)} parameters ({human(value)})<br>" \
           f"{_percent(report.share(value))} of {exact(report.total)}"


__all__ = ["Box", "Emphasis", "TRAINABLE", "Treemap", "active_share", "changed", "module_treemap", "role_treemap"]
