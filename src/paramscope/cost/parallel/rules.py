"""The sharding rules: how tensor and expert parallelism cut each parameter of the built model.

Each parameter's rule follows from its role (roles.py reads it from the real module structure: the owning module's
name and class), as Megatron and torch's `parallelize_module` plans cut a transformer layer; tests hold the column
and row sets equal to transformers' own `base_model_tp_plan` for every preset class that declares one:

| role | tensor parallel (t ranks) |
| --- | --- |
| attention.query / key / value / qkv, mlp.gate / up, MLA's q_up and kv_up | column: the output features / t (and the bias) |
| attention.output, mlp.down | row: the input features / t; the bias replicated |
| embeddings.word, head.lm, head.bias (vocabulary-wide) | vocabulary-parallel: ⌈V / t⌉ rows (torch's Shard(0): rank 0 holds the most) |
| moe.experts | the experts' widths as their dense twins (gate/up column, down row); routed experts / ep under expert parallelism |
| moe.shared_experts | column, or row for the projection back to the hidden size (its bias whole); which one is read from the projection's name (down_proj, w2...), from the shape only where the name does not say |
| KV heads when t exceeds them | replicated: each rank keeps the one KV head its query heads read (Megatron) |
| MLA's q_down, kv_down, their norms; norms, routers, position embeddings, the rest | replicated |

A tensor parallel degree that would split an attention head or leave a width uneven is refused, naming both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from ...errors import OptionError

COLUMN = frozenset({"attention.query", "attention.key", "attention.value", "attention.qkv", "attention.q_up",
                    "attention.kv_up", "mlp.gate", "mlp.up", "mlp.gate_up"})
ROW = frozenset({"attention.output", "mlp.down"})
VOCABULARY = frozenset({"embeddings.word", "head.lm", "head.bias"})
KEY_VALUE = frozenset({"attention.key", "attention.value"})


@dataclass(frozen=True)
class Placement:
    """One parameter on one device: the rule, the dimension it cuts, and the shape that device holds (rank 0, which
    holds the largest share where a cut is uneven)."""

    name: str
    role: str
    shape: tuple[int, ...]
    local_shape: tuple[int, ...]
    tp: str  # "column" | "row" | "vocabulary" | "kv-replicated" | "replicated"
    tp_dim: int | None
    experts_split: bool  # routed experts cut over the expert-parallel ranks
    dtype: str

    @property
    def local_numel(self) -> int:
        n = 1
        for size in self.local_shape:
            n *= size
        return n


@dataclass(frozen=True)
class ModelShape:
    """The config dimensions the rules check against."""

    hidden: int | None
    heads: int | None
    kv_heads: int | None
    conv1d: bool  # GPT-2's Conv1D stores weights [in, out]


def model_shape(config: Any, class_names: Iterable[str]) -> ModelShape:
    from ..dims import config_int, dim

    heads = dim(config, "heads")
    return ModelShape(dim(config, "hidden"), heads, config_int(config, "num_key_value_heads") or heads,
                      "Conv1D" in set(class_names))


def place(params: Iterable[Any], shape: ModelShape, *, tp: int, ep: int) -> tuple[Placement, ...]:
    """Every parameter's placement on rank 0 under tensor parallel degree `tp` and expert parallel degree `ep`."""
    if shape.heads and tp > 1 and shape.heads % tp:
        raise OptionError("{0} {tp} would split attention heads: {heads} heads are not a multiple of it", "tp",
                          tp=tp, heads=shape.heads)
    kv_replicated = False
    if shape.kv_heads and tp > shape.kv_heads:
        if tp % shape.kv_heads:
            raise OptionError("{0} {tp} exceeds the {kv} KV heads and is not a multiple of them, so the KV heads "
                              "cannot be replicated evenly", "tp", tp=tp, kv=shape.kv_heads)
        kv_replicated = True
    elif shape.kv_heads and tp > 1 and shape.kv_heads % tp:
        raise OptionError("{0} {tp} would split KV heads: {kv} KV heads are not a multiple of it", "tp", tp=tp,
                          kv=shape.kv_heads)
    return tuple(_place(p, shape, tp, ep, kv_replicated) for p in params)


def placements_for(report: Any, view: Any, layout: Any) -> tuple[Placement, ...]:
    """Each parameter's placement under `layout` (a ParallelLayout), read from the built class's parameters and the
    module classes it holds (the MLA and expert rules depend on them)."""
    from ..dims import text_config

    classes = {sub.__class__.__name__ for _, sub in view.root.named_modules()} if view.root is not None else set()
    return place(report.params, model_shape(text_config(view.config), classes), tp=layout.tp, ep=layout.ep)


def cuts_routed_experts(placements: Iterable[Placement]) -> bool:
    """Whether the layout these placements were made for cuts routed experts over its ep ranks: ep > 1 and the class
    has routed experts (a dense class under --ep keeps every weight whole, and its step is one device's)."""
    return any(p.experts_split for p in placements)


def _place(param: Any, shape: ModelShape, tp: int, ep: int, kv_replicated: bool) -> Placement:
    dims = tuple(param.shape)
    role = param.role
    local = list(dims)
    rule, cut = "replicated", None
    is_weight = len(dims) >= 2
    split_experts = False
    if role == "moe.experts" and len(dims) == 3:
        split_experts = ep > 1
        if ep > 1:
            if dims[0] % ep:
                raise OptionError("{0} {ep} does not divide the {experts} routed experts of {name}", "ep", ep=ep,
                                  experts=dims[0], name=param.name)
            local[0] = dims[0] // ep
        # [E, out, in]: the projection back to the hidden size is cut along its input (row), the others along
        # their output (column), as their dense twins are
        row = _back_to_hidden(param.name, shape.hidden is not None and dims[1] == shape.hidden and
                              dims[2] != shape.hidden)
        rule, cut = ("row", 2) if row else ("column", 1)
    elif role == "moe.shared_experts" and dims and dims[0] > 1:  # a one-output gate (Qwen2-MoE's) stays whole
        row = _back_to_hidden(param.name, shape.hidden is not None and is_weight and dims[0] == shape.hidden)
        if row and not is_weight:  # a row-parallel projection's bias is added once, after the reduction: whole
            rule, cut = "replicated", None
        else:
            rule, cut = ("row", 1) if row else ("column", 0)
    elif role in VOCABULARY:
        rule, cut = "vocabulary", 0
    elif role in COLUMN:
        if kv_replicated and role in KEY_VALUE:
            rule, cut = "kv-replicated", 0
        else:
            rule, cut = "column", (1 if shape.conv1d and is_weight else 0)
    elif role in ROW:
        if is_weight:
            rule, cut = "row", (0 if shape.conv1d else 1)
    if tp > 1 and cut is not None:
        size = dims[cut]
        if rule == "kv-replicated":
            local[cut] = size // shape.kv_heads  # one KV head a rank
        elif rule == "vocabulary":
            local[cut] = -(-size // tp)  # torch's Shard(0) of an uneven vocabulary: rank 0 holds ⌈V / t⌉
        else:
            if size % tp:
                raise OptionError("{0} {tp} does not divide {size:,}, the {what} features of {name} ({role})",
                                  "tp", tp=tp, size=size, what="output" if rule == "column" else "input",
                                  name=param.name, role=role)
            local[cut] = size // tp
    return Placement(param.name, role, dims, tuple(local), rule, cut, split_experts, param.dtype)


# the names transformers gives an MLP's projection back to the hidden size (Llama-style, Mixtral v4's w2, GPT-style)
DOWN_NAMES = ("down_proj", "w2", "c_proj", "fc2", "dense_4h_to_h", "wo")


def _back_to_hidden(name: str, by_shape: bool) -> bool:
    """Whether an expert's projection is the one back to the hidden size (cut row-wise): by its name where the
    name says (an intermediate width equal to the hidden size makes the shapes alike), else by its shape."""
    parts = name.split(".")
    owner = parts[-2] if parts[-1] in ("weight", "bias") and len(parts) > 1 else parts[-1]
    if owner in DOWN_NAMES:
        return True
    if owner in ("gate_proj", "up_proj", "gate_up_proj", "w1", "w3", "c_fc", "fc1", "dense_h_to_4h", "wi"):
        return False
    return by_shape


def tp_rule_words(rule: str, tp: int) -> str:
    return {"column": f"column-parallel (output features / {tp})", "row": f"row-parallel (input features / {tp})",
            "vocabulary": f"vocabulary-parallel (⌈V / {tp}⌉ rows)",
            "kv-replicated": "KV heads replicated: one KV head a rank",
            "replicated": "replicated"}[rule]


def rules_in_words(placements: tuple[Placement, ...], layout: Any) -> dict[str, str]:
    """Each role's rule under `layout` (a ParallelLayout), in words, by role: tensor parallelism's cut, the experts
    over ep, and the sequence over cp, so a layout without tp says what it does to each role ("whole; experts / ep
    8", "whole; the sequence split cp 2") rather than only what it does not."""
    words: dict[str, str] = {}
    routed = any(p.experts_split for p in placements)
    for p in placements:
        if p.role in words:
            continue
        if layout.tp > 1:
            rule = tp_rule_words(p.tp, layout.tp)
            cuts = {q.tp for q in placements if q.role == p.role}
            if p.role == "moe.experts" and cuts == {"column", "row"}:  # packed gate_up and down
                rule = (f"gate and up column-parallel (intermediate / {layout.tp} of each expert), down "
                        f"row-parallel (input features / {layout.tp})")
        elif layout.ep == 1 and layout.cp == 1:
            rule = "whole (no tensor parallelism)"
        else:
            rule = "whole" if p.experts_split or layout.ep == 1 else \
                f"whole (ep {layout.ep} cuts only the routed experts)" if routed else \
                f"whole (ep {layout.ep}: the class has no routed experts, so ep cuts nothing; each rank's step " \
                "is dp's alone)"
        if p.experts_split:
            rule += f"; experts / ep {layout.ep}"
        if layout.cp > 1:
            rule += f"; the sequence split cp {layout.cp}"
        words[p.role] = rule
    return dict(sorted(words.items()))
