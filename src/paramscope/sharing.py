"""Shared layers: one set of weights run as many layers (ALBERT, Universal-Transformer-style models).

The module tree holds a shared set once, so the counts are right by construction; what the reader needs is the
sentence that explains why 12 layers cost the parameters of one: "12 layers sharing one set of 7,087,872".

Two ways to find them:
- ALBERT's config: `num_hidden_layers` passes over `num_hidden_groups` layer groups (`albert_layer_groups`).
- Identity: a ModuleList holding the same module object at several indices (`nn.ModuleList([block] * 12)`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .count import ModuleNode, walk


@dataclass(frozen=True)
class SharedLayers:
    path: str  # the tree node holding the shared set(s), e.g. "albert.encoder.albert_layer_groups"
    layer_type: str  # class of one set, e.g. "AlbertLayerGroup"
    layers: int  # how many layers the forward pass runs
    sets: int  # how many distinct parameter sets they share
    params_per_set: tuple[int, ...]
    how: str  # how paramscope knows, in words

    @property
    def params(self) -> int:
        return sum(self.params_per_set)

    @property
    def text(self) -> str:
        if self.sets == 1:
            return f"{self.layers} layers sharing one set of {self.params:,}"
        if len(set(self.params_per_set)) == 1:
            per = self.layers / self.sets
            per_text = f"{int(per)}" if per == int(per) else f"{per:g}"
            return (f"{self.layers} layers sharing {self.sets} sets of {self.params_per_set[0]:,} each "
                    f"({per_text} layers per set)")
        return f"{self.layers} layers sharing {self.sets} sets, {self.params:,} in all"


def find_shared_layers(tree: ModuleNode, config: Any = None) -> tuple[SharedLayers, ...]:
    found: list[SharedLayers] = []
    albert = _albert(tree, config)
    if albert is not None:
        found.append(albert)
    for node in walk(tree):
        if any(c.path == node.name for c in found):
            continue
        if not all(child.attr.isdigit() for child in node.children):
            continue
        # A parameterless module reused (one ReLU at several indices) shares no weights: only layers with
        # parameters count, as layers and as sets.
        weighted = [child for child in node.children if child.params]
        shared = [child for child in weighted if child.uses > 1]
        if not shared:
            continue
        layers = sum(child.uses for child in weighted)
        found.append(SharedLayers(
            path=node.name,
            layer_type=shared[0].type,
            layers=layers,
            sets=len(weighted),
            params_per_set=tuple(child.params for child in weighted),
            how=f"the same module object is registered at {layers} indices of {node.name or 'the root'}",
        ))
    return tuple(found)


def _albert(tree: ModuleNode, config: Any) -> SharedLayers | None:
    layers = _get(config, "num_hidden_layers")
    groups = _get(config, "num_hidden_groups")
    if not isinstance(layers, int) or not isinstance(groups, int) or groups <= 0 or layers <= groups:
        return None
    node = next((n for n in walk(tree) if n.attr == "albert_layer_groups"), None)
    if node is None or not node.children:
        return None
    inner = _get(config, "inner_group_num")
    inner_text = f", {inner} layers in each group" if isinstance(inner, int) and inner > 1 else ""
    return SharedLayers(
        path=node.name,
        layer_type=node.children[0].type,
        layers=layers,
        sets=len(node.children),
        params_per_set=tuple(child.params for child in node.children),
        how=f"config num_hidden_layers={layers}, num_hidden_groups={groups}{inner_text}: "
            "each pass reuses a group's weights",
    )


def _get(config: Any, key: str) -> Any:
    if config is None:
        return None
    return config.get(key) if isinstance(config, dict) else getattr(config, key, None)
