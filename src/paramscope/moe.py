"""Mixture of experts: parameters used per token, and a per-layer view of dense and MoE layers.

Definition (the one the report states next to the figure):

    active = total − Σ over MoE layers of (E − k)/E × that layer's routed-expert parameters

where E is the number of routed experts and k the number each token is sent to. Shared experts, the router,
attention, norms, embeddings and heads all count as active. Routed experts are the parameters whose role is
`moe.experts`, whether stored as fused [E, …] tensors (transformers 5) or as one module per expert.

E comes from the experts themselves (the leading dimension of a fused tensor, or the number of per-expert
modules), falling back to the config; k comes from the config (num_experts_per_tok, top_k, …), searched in its
sub-configs too (text_config, thinker_config.text_config, …). Without k, or when sub-configs disagree on it, the
active count is unknown (None) rather than guessed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Iterable

from .count import ParameterInfo

ACTIVE_DEFINITION = (
    "total − Σ over MoE layers of (E − k)/E × that layer's routed-expert parameters; shared experts, "
    "the router, attention, norms, embeddings and heads count as active"
)

# Config fields, in the order they are tried.
EXPERT_FIELDS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts", "num_routed_experts")
TOP_K_FIELDS = (
    "num_experts_per_tok", "num_experts_per_token", "experts_per_token", "moe_top_k", "top_k",
    "router_top_k", "moe_k", "num_selected_experts",
)
SHARED_FIELDS = ("n_shared_experts", "num_shared_experts", "moe_num_shared_experts")
# Architectures whose routing is fixed by design rather than a config field.
FIXED_TOP_K = {"switch_transformers": 1, "nllb-moe": 2}

_LAYER = re.compile(r"^(.*?)\.(\d+)\.")
_EXPERT_INDEX = re.compile(r"\.experts\.(?:expert_)?(\d+)\.")


@dataclass(frozen=True)
class MoELayer:
    """One block of the layer stack: dense (no routed experts) or MoE."""

    name: str  # its path, e.g. "model.layers.3"
    index: int
    kind: str  # "moe" | "dense"
    params: int  # every parameter of the layer
    routed: int = 0  # routed experts' parameters, all E of them
    shared: int = 0  # shared experts (and their gate)
    router: int = 0
    num_experts: int = 0  # E in this layer (0 for a dense layer)
    top_k: int | None = None
    active: int | None = None  # params − routed·(E − k)/E; None when k is unknown

    @property
    def inactive(self) -> int | None:
        return None if self.active is None else self.params - self.active

    @property
    def per_expert(self) -> int:
        return self.routed // self.num_experts if self.num_experts else 0

    def same_shape(self, other: "MoELayer") -> bool:
        return (self.kind, self.params, self.routed, self.shared, self.router, self.num_experts, self.active) == (
            other.kind, other.params, other.routed, other.shared, other.router, other.num_experts, other.active)


@dataclass(frozen=True)
class MoESummary:
    num_experts: int  # E (the most common per-layer value)
    top_k: int | None  # k
    num_shared_experts: int | None  # from the config, when it says
    layout: str  # "fused [E, …] tensors" | "per-expert modules" | "mixed"
    total: int
    active: int | None
    routed: int  # all routed-expert parameters
    shared: int
    router: int
    layers: tuple[MoELayer, ...]
    source: str  # where E and k came from, in words
    definition: str = ACTIVE_DEFINITION

    @property
    def inactive(self) -> int | None:
        return None if self.active is None else self.total - self.active

    @property
    def moe_layers(self) -> tuple[MoELayer, ...]:
        return tuple(layer for layer in self.layers if layer.kind == "moe")

    @property
    def dense_layers(self) -> tuple[MoELayer, ...]:
        return tuple(layer for layer in self.layers if layer.kind == "dense")

    def runs(self) -> list[tuple[MoELayer, int]]:
        """Consecutive identical layers grouped: DeepSeek-V3 is 3 dense, then 58 MoE."""
        runs: list[tuple[MoELayer, int]] = []
        for layer in self.layers:
            if runs and runs[-1][0].same_shape(layer) and runs[-1][0].name.rsplit(".", 1)[0] == layer.name.rsplit(".", 1)[0]:
                runs[-1] = (runs[-1][0], runs[-1][1] + 1)
            else:
                runs.append((layer, 1))
        return runs


def config_value(config: Any, fields: Iterable[str]) -> tuple[str, int] | None:
    """The first of `fields` that `config` or one of its sub-configs sets to a positive int, as (where, value).

    `where` is the field's dotted path (`text_config.num_experts_per_tok`): multimodal and omni wrappers keep
    the language model's MoE settings in a sub-config (Qwen3.5-MoE's text_config, Qwen3-Omni's
    thinker_config.text_config), DBRX in ffn_config. The top level is searched first, then each depth in turn.
    """
    return next(iter(config_values(config, fields)), None)


def config_values(config: Any, fields: Iterable[str]) -> list[tuple[str, int]]:
    """For `config` and each sub-config that sets one of `fields`: the first it sets, as config_value gives it."""
    fields = tuple(fields)
    found = []
    for prefix, holder in _holders(config):
        for name in fields:
            value = holder.get(name) if isinstance(holder, dict) else getattr(holder, name, None)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                # transformers' attribute_map aliases (DeepSeek's n_routed_experts as num_local_experts)
                aliases = {} if isinstance(holder, dict) else getattr(holder, "attribute_map", None) or {}
                found.append((prefix + aliases.get(name, name), value))
                break
    return found


# Sub-configs are fields named *_config; these hold no model sizes.
_NOT_SUB_CONFIGS = frozenset({"quantization_config", "generation_config", "compression_config"})
# Searched first at each depth: the language model's settings win over a vision or audio tower's.
_PREFERRED_STEMS = ("text", "language", "llm", "thinker", "ffn")
_MAX_DEPTH = 3
_MAX_HOLDERS = 64


def _holders(config: Any) -> list[tuple[str, Any]]:
    """(dotted prefix, config) for `config` and its sub-configs, breadth first, depth and count bounded."""
    if config is None:
        return []
    out: list[tuple[str, Any]] = [("", config)]
    seen = {id(config)}
    level = [("", config)]
    for _ in range(_MAX_DEPTH):
        following = []
        for prefix, holder in level:
            for name, child in _sub_configs(holder):
                if id(child) not in seen and len(out) < _MAX_HOLDERS:
                    seen.add(id(child))
                    following.append((f"{prefix}{name}.", child))
        out.extend(following)
        level = following
    return out


def _sub_configs(holder: Any) -> list[tuple[str, Any]]:
    if isinstance(holder, dict):
        items = list(holder.items())
    else:
        try:
            items = list(vars(holder).items())
        except TypeError:  # no __dict__ (slots, builtins): nothing nested
            return []
    found = [(name, value) for name, value in items
             if isinstance(name, str) and name.endswith("_config") and name not in _NOT_SUB_CONFIGS
             and (isinstance(value, dict) or _is_config_object(value))]

    def rank(item: tuple[str, Any]) -> int:
        stem = item[0][: -len("_config")]
        return _PREFERRED_STEMS.index(stem) if stem in _PREFERRED_STEMS else len(_PREFERRED_STEMS)

    return sorted(found, key=rank)


def _is_config_object(value: Any) -> bool:
    """A PretrainedConfig by duck type (this module imports no transformers)."""
    return not isinstance(value, type) and callable(getattr(value, "to_dict", None)) and hasattr(value, "model_type")


def summarize_moe(params: tuple[ParameterInfo, ...], config: Any = None, total: int | None = None) -> MoESummary | None:
    """The MoE view of a counted model, or None when it has no routed experts."""
    routed = [p for p in params if p.role == "moe.experts"]
    if not routed:
        return None
    total = sum(p.numel for p in params) if total is None else total

    # Layers: the numbered blocks of every stack that holds routed experts.
    stacks = {m.group(1) for p in routed if (m := _LAYER.match(p.name))}
    layer_params: dict[tuple[str, int], list[ParameterInfo]] = {}
    order: list[tuple[str, int]] = []
    loose_routed = 0
    for p in params:
        m = _LAYER.match(p.name)
        if m and m.group(1) in stacks:
            key = (m.group(1), int(m.group(2)))
            if key not in layer_params:
                layer_params[key] = []
                order.append(key)
            layer_params[key].append(p)
        elif p.role == "moe.experts":
            loose_routed += p.numel
    first_seen: dict[str, int] = {}
    for i, (stack, _) in enumerate(order):
        first_seen.setdefault(stack, i)
    order.sort(key=lambda key: (first_seen[key[0]], key[1]))

    config_e = config_value(config, EXPERT_FIELDS)
    all_k = config_values(config, TOP_K_FIELDS)
    config_k = all_k[0] if all_k else None
    # one k serves every MoE layer: sub-configs that disagree (a thinker and a talker) leave it unknown
    conflicting_k = len({value for _, value in all_k}) > 1
    if conflicting_k:
        config_k = None
    model_type = (config.get("model_type") if isinstance(config, dict) else getattr(config, "model_type", None))
    if config_k is None and not conflicting_k and model_type in FIXED_TOP_K:
        config_k = (f"{model_type} routing", FIXED_TOP_K[model_type])
    top_k = config_k[1] if config_k else None
    shared_count = config_value(config, SHARED_FIELDS)

    layers: list[MoELayer] = []
    layouts: set[str] = set()
    for stack, index in order:
        members = layer_params[(stack, index)]
        layer_total = sum(p.numel for p in members)
        experts = [p for p in members if p.role == "moe.experts"]
        if not experts:
            layers.append(MoELayer(f"{stack}.{index}", index, "dense", layer_total, active=layer_total))
            continue
        e, layout = _experts_in(experts)
        if e is None:
            e = config_e[1] if config_e else None
        layouts.add(layout)
        routed_numel = sum(p.numel for p in experts)
        shared = sum(p.numel for p in members if p.role == "moe.shared_experts")
        router = sum(p.numel for p in members if p.role == "moe.router")
        active = None
        if top_k is not None and e:
            inactive = Fraction(routed_numel * (e - min(top_k, e)), e)
            active = layer_total - round(inactive)
        layers.append(MoELayer(f"{stack}.{index}", index, "moe", layer_total, routed_numel, shared, router,
                               e or 0, top_k, active))

    moe_layers = [layer for layer in layers if layer.kind == "moe"]
    counts = [layer.num_experts for layer in moe_layers if layer.num_experts]
    num_experts = max(set(counts), key=counts.count) if counts else (config_e[1] if config_e else 0)
    active_total = None
    if top_k is not None and all(layer.active is not None for layer in moe_layers) and not loose_routed:
        active_total = total - sum(layer.params - layer.active for layer in moe_layers)

    source = []
    if config_e:
        source.append(f"E from config {config_e[0]}={config_e[1]}")
    elif counts:
        source.append(f"E = {num_experts} from the expert tensors")
    if config_k:
        source.append(f"k from config {config_k[0]}={config_k[1]}")
    elif conflicting_k:
        source.append("k unknown: the sub-configs disagree (" + ", ".join(f"{where}={k}" for where, k in all_k)
                      + "), so active parameters are not computed")
    else:
        source.append("k unknown: the config names no top-k field, so active parameters are not computed")
    if config_e and counts and config_e[1] != num_experts:
        source.append(f"the model holds {num_experts} experts per layer; that figure is used")
    return MoESummary(
        num_experts=num_experts,
        top_k=top_k,
        num_shared_experts=shared_count[1] if shared_count else None,
        layout=layouts.pop() if len(layouts) == 1 else "mixed",
        total=total,
        active=active_total,
        routed=sum(p.numel for p in routed),
        shared=sum(p.numel for p in params if p.role == "moe.shared_experts"),
        router=sum(p.numel for p in params if p.role == "moe.router"),
        layers=tuple(layers),
        source="; ".join(source),
    )


def _experts_in(experts: list[ParameterInfo]) -> tuple[int | None, str]:
    """(E, layout) from one layer's routed-expert tensors."""
    indices = {int(m.group(1)) for p in experts if (m := _EXPERT_INDEX.search(p.name))}
    if indices:
        return len(indices), "per-expert modules"
    # Only a 3-D tensor's leading dimension is E; DBRX packs experts as 2-D [E·F, D] and needs the config.
    leading = {p.shape[0] for p in experts if len(p.shape) >= 3}
    if len(leading) == 1:
        return leading.pop(), "fused [E, …] tensors"
    return None, "fused [E, …] tensors"
