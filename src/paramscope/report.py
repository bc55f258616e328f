"""The report: frozen data that every renderer takes. No formatting happens here."""

from __future__ import annotations

from dataclasses import dataclass, replace

from .conventions import Convention
from .display import HtmlDisplay
from .frozen import FrozenDict, freeze_fields
from .count import BufferInfo, Counted, Counts, ModuleNode, ParameterInfo, TiedGroup
from .moe import MoESummary
from .quant import Storage
from .sharing import SharedLayers

SCHEMA_VERSION = 3


@dataclass(frozen=True)
class ModelInfo:
    source: str  # plain-language origin, e.g. "embedded preset google-bert/bert-base-uncased"
    source_kind: str  # preset | config-file | directory | hub | hub-cache | module | config-object
    label: str  # short name for titles
    class_name: str
    class_reason: str  # why this class was built
    model_type: str | None
    native: bool | None  # built from transformers' own class (True), remote code (False), or not a config build (None)
    transformers_version: str | None
    notes: tuple[str, ...] = ()
    storage: Storage | None = None  # declared dtype and quantisation of the checkpoint, from its config
    base_model_prefix: str | None = None  # e.g. "bert": task models hold the base model under it
    engine: str = "build"  # what answered: "build" (the class built on meta) or "template" (template.py)
    engine_detail: str | None = None  # why the build answered (no template, or one did not apply), in words


@dataclass(frozen=True)
class Component:
    """A top-level part of the model (embeddings, encoder, pooler, a head), as people sketch it."""

    name: str
    type: str
    params: int
    repeated: tuple[str, int, int] | None = None  # (layer type, count, params each) when one run fills it
    shared: str | None = None  # "12 layers sharing one set of 7,087,872" when it holds shared layers


@dataclass(frozen=True)
class Report(HtmlDisplay):
    model: ModelInfo
    parameters: Counts
    params: tuple[ParameterInfo, ...]
    tied: tuple[TiedGroup, ...]
    buffers: tuple[BufferInfo, ...]
    breakdown: FrozenDict[str, int]  # role → parameters
    unclassified: tuple[str, ...]
    tree: ModuleNode
    components: tuple[Component, ...]
    num_layers: int | None = None
    moe: MoESummary | None = None  # None for dense models
    conventions: tuple[Convention, ...] = ()  # the named counts (nanoGPT non-embedding, …)
    shared_layers: tuple[SharedLayers, ...] = ()
    uninitialized: tuple[str, ...] = ()  # tensors of lazy modules with no shape yet: listed, not counted

    def __post_init__(self) -> None:
        freeze_fields(self, "breakdown")  # read-only and hashable (frozen.py), whatever the caller passed

    @property
    def active(self) -> int | None:
        """Parameters used per token: the total for a dense model; None for MoE when top-k is unknown."""
        return self.parameters.active

    def convention(self, key: str) -> Convention | None:
        return next((c for c in self.conventions if c.key == key), None)

    @property
    def total(self) -> int:
        return self.parameters.total

    def share(self, count: int) -> float:
        return count / self.parameters.total if self.parameters.total else 0.0

    def by_role(self, role: str) -> tuple[ParameterInfo, ...]:
        return tuple(p for p in self.params if p.role == role)

    def node(self, name: str) -> ModuleNode:
        """The tree node at dotted path `name` ("" is the root).

        Raises KeyError naming the path when no module is there, or when the path is an alias: a shared module's
        other index, or a back-reference (a cycle). Each module is in the tree once, under its first path."""
        node = self.tree
        for part in [p for p in name.split(".") if p]:
            child = next((c for c in node.children if c.attr == part), None)
            if child is None:
                alias_of = next((c.name for c in node.children if part in c.aliases), None)
                if alias_of is None:
                    raise KeyError(f"no module at {name!r}")
                raise KeyError(f"{name!r} is an alias: the module is in the tree at {alias_of!r}")
            if child.back_reference is not None:
                raise KeyError(f"{name!r} is an alias: the module is in the tree at {child.back_reference!r}")
            node = child
        return node

    # --- display: a short repr, and the full text report in IPython and Jupyter --------------------------------

    def __repr__(self) -> str:
        active = "" if self.moe is None or self.parameters.active is None else f", {self.parameters.active:,} active"
        return (f"<Report {self.model.class_name} of {self.model.label}: {self.parameters.total:,} parameters"
                f"{active}>")


def make_report(model_info: ModelInfo, counted: Counted, base_model_prefix: str | None = None, *,
                moe: MoESummary | None = None, conventions: tuple[Convention, ...] = (),
                shared_layers: tuple[SharedLayers, ...] = ()) -> Report:
    active = counted.counts.total if moe is None else moe.active
    components = _components(counted.tree, base_model_prefix)
    if shared_layers:
        components = tuple(_with_shared(c, shared_layers) for c in components)
    num_layers = _layer_count(counted.tree)
    if num_layers is None and shared_layers:
        num_layers = max(s.layers for s in shared_layers)
    if base_model_prefix and model_info.base_model_prefix is None:
        model_info = replace(model_info, base_model_prefix=base_model_prefix)
    return Report(
        model=model_info,
        parameters=replace(counted.counts, active=active),
        params=counted.parameters,
        tied=counted.tied,
        buffers=counted.buffers,
        breakdown=counted.breakdown,
        unclassified=counted.unclassified,
        tree=counted.tree,
        components=components,
        num_layers=num_layers,
        moe=moe,
        conventions=conventions,
        shared_layers=shared_layers,
        uninitialized=counted.uninitialized,
    )


def _with_shared(component: Component, shared_layers: tuple[SharedLayers, ...]) -> Component:
    for shared in shared_layers:
        if shared.path == component.name or shared.path.startswith(component.name + "."):
            return replace(component, shared=shared.text)
    return component


def _components(tree: ModuleNode, base_model_prefix: str | None) -> tuple[Component, ...]:
    """The base model's children, then the task model's own top-level parts (heads)."""
    parts: list[ModuleNode] = []
    for child in tree.children:
        if base_model_prefix and child.attr == base_model_prefix and child.children:
            parts.extend(child.children)
        else:
            parts.append(child)
    if tree.own:
        parts.append(ModuleNode(tree.name, "(own parameters)", tree.type, _own_numel(tree), tree.own, (), (), 0))
    components = []
    for part in parts:
        if part.params == 0:
            continue
        components.append(Component(part.name or part.attr, part.type, part.params, _single_run(part)))
    return tuple(components)


def _own_numel(tree: ModuleNode) -> int:
    return tree.params - sum(c.params for c in tree.children)


def _single_run(node: ModuleNode) -> tuple[str, int, int] | None:
    """(layer type, n, params each) when a block's parameters are one run of identical layers.

    Follows single-child chains, so BertEncoder → layer (ModuleList) → 12 × BertLayer is found.
    """
    from .count import collapse_runs

    while not node.own:
        runs = collapse_runs(c for c in node.children if c.params)
        if len(runs) != 1:
            return None
        first, n, _ = runs[0]
        if n > 1:
            return (first.type, n, first.params)
        node = first
    return None


def _layer_count(tree: ModuleNode) -> int | None:
    """The model's layer count: the longest run of numbered blocks of one class in a stack.

    The class, not the full structure: T5's block 0 alone carries the relative-attention bias, and Qwen3-Next
    mixes linear- and full-attention layers, yet each is one stack of blocks. An encoder–decoder counts per stack."""
    from .count import walk

    best = None
    for node in walk(tree):
        run_type, n = None, 0
        for child in node.children:
            if not child.attr.isdigit() or not child.params:
                run_type, n = None, 0
                continue
            run_type, n = child.type, (n + 1 if child.type == run_type else 1)
            if n > 1 and (best is None or n > best):
                best = n
    return best
