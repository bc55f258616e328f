"""Counting a module: unique parameters by identity, tied groups, buffers, and the owned-parameter tree.

Ties are found by Parameter identity (`id`), not storage pointers: meta tensors have no storage.
Each parameter belongs to exactly one place, its canonical (first-registered) name, so the tree
and the role breakdown both sum exactly to the total.

Live modules may hold what a built model never does: uninitialised tensors (`nn.LazyLinear` before its first
forward pass), which have no shape and are listed instead of counted, and cycles (`a.me = a`), which are walked
once: a module met again inside itself ends the path there, shown as a back-reference.
"""

from __future__ import annotations

import re

from dataclasses import dataclass, replace
from typing import Any, Callable, Hashable, Iterable, TypeVar

from .frozen import FrozenDict, freeze_fields
from .roles import OTHER, buffer_role, role_of, role_sort_key

T = TypeVar("T")


@dataclass(frozen=True)
class ParameterInfo:
    name: str  # canonical name: the first name named_parameters() gives this tensor
    shape: tuple[int, ...]
    numel: int
    trainable: bool
    role: str
    dtype: str
    aliases: tuple[str, ...] = ()  # other names of the same Parameter object (tied weights)


@dataclass(frozen=True)
class TiedGroup:
    canonical: str
    aliases: tuple[str, ...]
    numel: int
    shape: tuple[int, ...]


@dataclass(frozen=True)
class BufferInfo:
    name: str
    shape: tuple[int, ...]
    numel: int
    persistent: bool
    role: str | None = None  # set only for buffers that hold learned values (a router's correction bias)
    dtype: str = "float32"


@dataclass(frozen=True)
class ModuleNode:
    name: str  # full dotted path, "" for the root
    attr: str  # the attribute name under its parent ("" for the root)
    type: str
    params: int  # unique parameters owned in this subtree (canonical names only)
    own: tuple[str, ...]  # local names of parameters this module itself owns
    tied: tuple[tuple[str, str], ...]  # (local name, canonical name) of parameters owned elsewhere
    children: tuple["ModuleNode", ...]
    signature: int  # equal for structurally identical subtrees; used to collapse repeated layers
    uses: int = 1  # how many of the parent's attributes hold this same module object (shared layers)
    aliases: tuple[str, ...] = ()  # the parent's other attribute names for this module object
    back_reference: str | None = None  # a cycle: the path of the enclosing module this attribute holds; no subtree


@dataclass(frozen=True)
class Counts:
    total: int
    trainable: int
    frozen: int
    with_tied_duplicates: int
    buffers: int
    active: int | None = None  # parameters used per token: the total for dense models (set by make_report)


@dataclass(frozen=True)
class Counted:
    counts: Counts
    parameters: tuple[ParameterInfo, ...]
    tied: tuple[TiedGroup, ...]
    buffers: tuple[BufferInfo, ...]
    breakdown: FrozenDict[str, int]  # role → parameters
    unclassified: tuple[str, ...]
    tree: ModuleNode
    uninitialized: tuple[str, ...] = ()  # parameters and buffers with no shape yet (lazy modules): not counted

    def __post_init__(self) -> None:
        freeze_fields(self, "breakdown")


def count_module(module: Any) -> Counted:
    """Everything paramscope knows about `module`'s parameters. Never touches tensor data."""
    modules = _module_paths(module)
    names_by_id: dict[int, list[str]] = {}
    tensors: dict[int, Any] = {}
    uninitialized: dict[int, str] = {}  # each uninitialised tensor under its first name
    with_duplicates = 0
    for module_name, submodule, _ in modules:
        for local, param in submodule._parameters.items():  # named_parameters(remove_duplicate=False), cycle-safe
            if param is None:
                continue
            name = f"{module_name}.{local}" if module_name else local
            if _is_uninitialized(param):
                uninitialized.setdefault(id(param), name)
                continue
            names_by_id.setdefault(id(param), []).append(name)
            tensors[id(param)] = param
            with_duplicates += param.numel()

    types_of = {name: types for name, _, types in modules}

    canonical_of: dict[str, str] = {}
    infos: list[ParameterInfo] = []
    roles_seen: dict[tuple[str, tuple[str, ...]], str] = {}
    tied: list[TiedGroup] = []
    for key, names in names_by_id.items():
        param = tensors[key]
        canonical, aliases = names[0], tuple(names[1:])
        for name in names:
            canonical_of[name] = canonical
        shape = tuple(int(d) for d in param.shape)
        numel = int(param.numel())
        infos.append(
            ParameterInfo(
                name=canonical,
                shape=shape,
                numel=numel,
                trainable=bool(param.requires_grad),
                role=_role_memo(canonical, _types_for(canonical, types_of), roles_seen),
                dtype=str(param.dtype).removeprefix("torch."),
                aliases=aliases,
            )
        )
        if aliases:
            tied.append(TiedGroup(canonical, aliases, numel, shape))

    total = sum(p.numel for p in infos)
    trainable = sum(p.numel for p in infos if p.trainable)
    breakdown: dict[str, int] = {}
    for info in infos:
        breakdown[info.role] = breakdown.get(info.role, 0) + info.numel
    breakdown = dict(sorted(breakdown.items(), key=lambda item: role_sort_key(item[0])))

    buffers: list[BufferInfo] = []
    seen_buffers: set[int] = set()
    for module_name, submodule, _ in modules:
        non_persistent = getattr(submodule, "_non_persistent_buffers_set", set())
        for local, buffer in submodule._buffers.items():
            if buffer is None or id(buffer) in seen_buffers:
                continue
            seen_buffers.add(id(buffer))
            full = f"{module_name}.{local}" if module_name else local
            if _is_uninitialized(buffer):
                uninitialized.setdefault(id(buffer), full)
                continue
            buffers.append(BufferInfo(full, tuple(int(d) for d in buffer.shape), int(buffer.numel()),
                                      local not in non_persistent, buffer_role(full, _types_for(full, types_of)),
                                      str(buffer.dtype).removeprefix("torch.")))

    numel_of = {info.name: info.numel for info in infos}
    tree = _node(module, "", "", canonical_of, numel_of, {})
    return Counted(
        counts=Counts(
            total=total,
            trainable=trainable,
            frozen=total - trainable,
            with_tied_duplicates=with_duplicates,
            buffers=sum(b.numel for b in buffers),
        ),
        parameters=tuple(infos),
        tied=tuple(tied),
        buffers=tuple(buffers),
        breakdown=breakdown,
        unclassified=tuple(info.name for info in infos if info.role == OTHER),
        tree=tree,
        uninitialized=tuple(uninitialized.values()),
    )


def _module_paths(module: Any) -> list[tuple[str, Any, tuple[str, ...]]]:
    """Every (path, module, class names from the root to it), a shared module under each of its paths, in the
    order of named_modules(remove_duplicate=False), except that a module met again inside itself ends the path:
    torch's walk would recurse forever on `a.me = a`."""
    paths: list[tuple[str, Any, tuple[str, ...]]] = []

    def visit(path: str, current: Any, types: tuple[str, ...], enclosing: set[int]) -> None:
        types = (*types, type(current).__name__)
        paths.append((path, current, types))
        enclosing.add(id(current))
        for attr, child in current._modules.items():
            if child is not None and id(child) not in enclosing:
                visit(f"{path}.{attr}" if path else attr, child, types, enclosing)
        enclosing.discard(id(current))

    visit("", module, (), set())
    return paths


def _is_uninitialized(tensor: Any) -> bool:
    """torch's UninitializedParameter/UninitializedBuffer (lazy modules): no shape until the first forward pass.
    Their mixin is the one tensor type with `materialize`; duck-typed so that counting never imports torch."""
    return callable(getattr(tensor, "materialize", None))


_INDEX_PART = re.compile(r"(?:^|(?<=\.))\d+(?=\.)")
# The first layer index inside a name ('encoder.layer.7.attention…' → 7): what explain, diff and its renderer group by.
LAYER_INDEX = re.compile(r"\.(\d+)\.")


def index_pattern(name: str, wildcard: str = "*") -> str:
    """`name` with every numeric path part but the last replaced: 'layers.7.mlp.0.weight' → 'layers.*.mlp.*.weight'.
    Names of one tensor family across layers share a pattern."""
    return _INDEX_PART.sub(wildcard, name)


def _role_memo(name: str, types: tuple[str, ...], seen: dict[tuple[str, tuple[str, ...]], str]) -> str:
    """role_of, once per tensor family: layer 7's query has the role of layer 0's when their module types agree
    (the rules read `\\d+`, never a particular index)."""
    key = (index_pattern(name, "0"), types)
    role = seen.get(key)
    if role is None:
        role = seen[key] = role_of(name, types)
    return role


def _types_for(tensor_name: str, types_of: dict[str, tuple[str, ...]]) -> tuple[str, ...]:
    """Class names of the modules from the root to the owner of `tensor_name`."""
    return types_of[tensor_name.rpartition(".")[0]]


def _node(module: Any, name: str, attr: str, canonical_of: dict[str, str], numel_of: dict[str, int],
          enclosing: dict[int, str]) -> ModuleNode:
    """The subtree at `name`; `enclosing` maps the ids of the modules on the path from the root to their paths."""
    own: list[str] = []
    tied: list[tuple[str, str]] = []
    own_numel = 0
    shape_key: list[Any] = [type(module).__name__]
    for local, param in module._parameters.items():  # named_parameters(recurse=False), without its memo set
        full = f"{name}.{local}" if name else local
        canonical = canonical_of.get(full)
        if canonical is None:  # None, or uninitialised: not counted (listed in Counted.uninitialized)
            continue
        shape_key.append((local, tuple(param.shape), canonical == full))
        if canonical == full:
            own.append(local)
            own_numel += numel_of[full]
        else:
            tied.append((local, canonical))
    children = []
    attrs_of: dict[int, list[str]] = {}
    for child_attr, child in module._modules.items():
        if child is not None:
            attrs_of.setdefault(id(child), []).append(child_attr)
    enclosing[id(module)] = name
    visited: set[int] = set()
    for child_attr, child in module._modules.items():  # named_children(): each child once, under its first name
        if child is None or id(child) in visited:
            continue
        visited.add(id(child))
        child_name = f"{name}.{child_attr}" if name else child_attr
        if id(child) in enclosing:
            target = enclosing[id(child)]
            node = ModuleNode(child_name, child_attr, type(child).__name__, 0, (), (), (),
                              hash(("back-reference", target)), back_reference=target)
        else:
            node = _node(child, child_name, child_attr, canonical_of, numel_of, enclosing)
        attrs = attrs_of[id(child)]
        if len(attrs) > 1:
            node = replace(node, uses=len(attrs), aliases=tuple(a for a in attrs if a != child_attr))
        children.append(node)
        shape_key.append((child_attr.isdigit() or child_attr, node.signature))
    del enclosing[id(module)]
    return ModuleNode(
        name=name,
        attr=attr,
        type=type(module).__name__,
        params=own_numel + sum(c.params for c in children),
        own=tuple(own),
        tied=tuple(tied),
        children=tuple(children),
        signature=hash(tuple(shape_key)),
    )


def collapse_runs(items: Iterable[T], key: Callable[[T], Hashable] = lambda node: node.signature,
                  index: Callable[[T], int | None] = lambda node: int(node.attr) if node.attr.isdigit() else None,
                  ) -> list[tuple[T, int, int]]:
    """Group numbered siblings that are alike at evenly spaced indices into (first, count, index step).

    12 BertLayers become (layer 0, 12, 1); the Linear layers of a Sequential that alternates Linear and ReLU,
    once the parameterless ReLUs are left out, (layer 0, n, 2). By default items are ModuleNodes, alike when
    structurally identical; for other items `key` says which are alike and `index` gives the number (None: not
    numbered, never part of a run)."""
    runs: list[tuple[T, int, int]] = []
    last = None
    for item in items:
        position = index(item)
        if runs and position is not None and last is not None and key(runs[-1][0]) == key(item):
            first, n, step = runs[-1]
            gap = position - last
            if gap > 0 and (n == 1 or gap == step):
                runs[-1] = (first, n + 1, gap)
                last = position
                continue
        runs.append((item, 1, 1))
        last = position
    return runs


def walk(node: ModuleNode):
    yield node
    for child in node.children:
        yield from walk(child)
