"""Counting a module: unique parameters by identity, tied groups, buffers, and the owned-parameter tree.

Ties are found by Parameter identity (`id`), not storage pointers: meta tensors have no storage.
Each parameter belongs to exactly one place, its canonical (first-registered) name, so the tree
and the role breakdown both sum exactly to the total.
"""

from __future__ import annotations

import re

from dataclasses import dataclass, replace
from typing import Any

from .roles import OTHER, buffer_role, role_of, role_sort_key


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
    breakdown: dict[str, int]
    unclassified: tuple[str, ...]
    tree: ModuleNode


def count_module(module: Any) -> Counted:
    """Everything paramscope knows about `module`'s parameters. Never touches tensor data."""
    names_by_id: dict[int, list[str]] = {}
    tensors: dict[int, Any] = {}
    with_duplicates = 0
    for name, param in module.named_parameters(remove_duplicate=False):
        names_by_id.setdefault(id(param), []).append(name)
        tensors[id(param)] = param
        with_duplicates += param.numel()

    types_of = _module_types(module)

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
        infos.append(
            ParameterInfo(
                name=canonical,
                shape=shape,
                numel=int(param.numel()),
                trainable=bool(param.requires_grad),
                role=_role_memo(canonical, _types_for(canonical, types_of), roles_seen),
                dtype=str(param.dtype).removeprefix("torch."),
                aliases=aliases,
            )
        )
        if aliases:
            tied.append(TiedGroup(canonical, aliases, int(param.numel()), shape))

    total = sum(p.numel for p in infos)
    trainable = sum(p.numel for p in infos if p.trainable)
    breakdown: dict[str, int] = {}
    for info in infos:
        breakdown[info.role] = breakdown.get(info.role, 0) + info.numel
    breakdown = dict(sorted(breakdown.items(), key=lambda item: role_sort_key(item[0])))

    buffers: list[BufferInfo] = []
    seen_buffers: set[int] = set()
    for module_name, submodule in module.named_modules(remove_duplicate=False):
        non_persistent = getattr(submodule, "_non_persistent_buffers_set", set())
        for local, buffer in submodule._buffers.items():
            if buffer is None or id(buffer) in seen_buffers:
                continue
            seen_buffers.add(id(buffer))
            full = f"{module_name}.{local}" if module_name else local
            buffers.append(BufferInfo(full, tuple(int(d) for d in buffer.shape), int(buffer.numel()),
                                      local not in non_persistent, buffer_role(full, _types_for(full, types_of))))

    numel_of = {info.name: info.numel for info in infos}
    tree = _node(module, "", "", canonical_of, numel_of)
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
    )


_LAYER_INDEX = re.compile(r"\.\d+(?=\.)")


def _role_memo(name: str, types: tuple[str, ...], seen: dict[tuple[str, tuple[str, ...]], str]) -> str:
    """role_of, once per tensor family: layer 7's query has the role of layer 0's when their module types agree
    (the rules read `\\d+`, never a particular index)."""
    key = (_LAYER_INDEX.sub(".0", name), types)
    role = seen.get(key)
    if role is None:
        role = seen[key] = role_of(name, types)
    return role


def _module_types(module: Any) -> dict[str, str]:
    """Every module path (shared modules under each of their names) → its class name."""
    return {name: type(sub).__name__ for name, sub in module.named_modules(remove_duplicate=False)}


def _types_for(tensor_name: str, types_of: dict[str, str]) -> tuple[str, ...]:
    """Class names of the modules from the root to the owner of `tensor_name`."""
    parts = tensor_name.split(".")[:-1]
    path = [types_of.get("", "")]
    for i in range(1, len(parts) + 1):
        path.append(types_of.get(".".join(parts[:i]), ""))
    return tuple(path)


def _node(module: Any, name: str, attr: str, canonical_of: dict[str, str], numel_of: dict[str, int]) -> ModuleNode:
    own: list[str] = []
    tied: list[tuple[str, str]] = []
    own_numel = 0
    shape_key: list[Any] = [type(module).__name__]
    for local, param in module._parameters.items():  # named_parameters(recurse=False), without its memo set
        if param is None:
            continue
        full = f"{name}.{local}" if name else local
        canonical = canonical_of[full]
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
    visited: set[int] = set()
    for child_attr, child in module._modules.items():  # named_children(): each child once, under its first name
        if child is None or id(child) in visited:
            continue
        visited.add(id(child))
        child_name = f"{name}.{child_attr}" if name else child_attr
        node = _node(child, child_name, child_attr, canonical_of, numel_of)
        attrs = attrs_of.get(id(child), [child_attr])
        if len(attrs) > 1:
            node = replace(node, uses=len(attrs), aliases=tuple(a for a in attrs if a != child_attr))
        children.append(node)
        shape_key.append((child_attr.isdigit() or child_attr, node.signature))
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


def collapse_runs(children: tuple[ModuleNode, ...]) -> list[tuple[ModuleNode, int]]:
    """Group consecutive structurally identical siblings: 12 BertLayers become (layer 0, 12)."""
    runs: list[tuple[ModuleNode, int]] = []
    for child in children:
        if runs and runs[-1][0].signature == child.signature and child.attr.isdigit():
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((child, 1))
    return runs


def walk(node: ModuleNode):
    yield node
    for child in node.children:
        yield from walk(child)
