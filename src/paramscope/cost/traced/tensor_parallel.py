"""One rank's tensor parallelism on the "tp" submesh (parallel.py applies it before FSDP2).

Tensor parallel rules. transformers' own plan is read from the model (`tp_plan`: the class's `_tp_plan`, e.g.
LlamaForCausalLM's lm_head `colwise_gather_output`, the config's `base_model_tp_plan` prefixed with the base model's
path, and transformers' vocab-parallel `embed_tokens`), and each style becomes torch's: colwise → ColwiseParallel,
rowwise → RowwiseParallel, colwise_gather_output → ColwiseParallel with a Replicate output, embedding_rowwise →
RowwiseParallel with a Replicate input. What the plan leaves out follows Megatron/torchtitan: an input embedding
vocab-parallel, an output head colwise with its output gathered, norms replicated (SequenceParallel under `sp`).
A class without a plan (BERT) gets a Megatron-style one from its layers' module names; GPT-2's Conv1D projections
(weights [in, out], q, k and v fused in c_attn) take conv1d_parallel.py's styles, torch's with a Conv1D's partition
(c_attn and mlp.c_fc column-parallel, the fused q | k | v regrouped per rank, the c_projs row-parallel, their bias
added once). Styles of transformers' own
with no torch counterpart are refused, except the packed MoE experts' group (`X.experts` moe_tp_experts with its
gate_up_proj packed_colwise and down_proj rowwise), which moe_parallel.py's PackedExpertsParallel applies as Megatron
cuts each expert; under `sp` the MoE block gathers its input and reduce-scatters the experts' partial sums. A shared
expert beside them (Qwen2-MoE's, which transformers' plan leaves whole) is cut as Megatron cuts an MLP; under `sp`
its output stays Partial and its one-output gate whole (a Replicate DTensor), so the gated sum reduce-scatters once
with the experts' partial sums, as torchtitan treats a shared expert (moe_parallel.shared_expert_styles).

Sequence parallel: transformers builds the causal mask and the rotary tables from the embedding output's length,
so the embedding's output stays whole (replicated); the residual stream is split on the sequence going into the
first layer (PrepareModuleInput Replicate → Shard(1)), every norm of the residual stream in a layer (a pre-norm
decoder's input and post-attention norms; post-norm BERT's attention.output.LayerNorm and output.LayerNorm, after
the add of a Shard(1) rowwise output and the Shard(1) layer input) and the final norm run SequenceParallel, the
parent of each column-parallel projection (self_attn and mlp; BERT's attention.self and intermediate) gathers its
input (PrepareModuleInput Shard(1) → Replicate), as does a pooler (BERT's reads token 0), rowwise outputs are
reduce-scattered (Shard(1)), and the head gathers its input (Shard(1)); the per-token layers in front of a head
(BERT's prediction transform) run on the rank's tokens. How each block is called (hidden states
by position or by keyword) is read from one probe forward of the copy on `tp` tokens.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ...errors import OptionError, UnsupportedError
from ..dims import dim, text_config
from .blocks import layer_lists
from .conv1d_parallel import (COLWISE_QKV as CONV1D_QKV, STYLES as CONV1D_STYLES, check_fused_qkv, conv1d_rule,
                              conv1d_style, localize_attention, sharded_axis)
from .moe_parallel import (EXPERTS_STYLE, PACKED_STYLES, SHARED_DOWN_STYLE, SHARED_GATE_STYLE, check_packed_experts,
                           packed_experts_style, sequence_parallel_block, shared_expert_styles)

# transformers' style names this engine maps onto torch's ParallelStyles (what each becomes: _torch_style), and
# those that keep the parameter whole on every rank (a per-head norm whose gradient transformers all-reduces in place)
TORCH_STYLES = ("colwise", "rowwise", "colwise_gather_output", "colwise_rep", "rowwise_split_input", "rowwise_rep",
                "embedding_rowwise")
REPLICATED_STYLES = ("replicate", "replicated_with_grad_allreduce")
# Megatron's names for the layers of a class without a plan (BERT): suffix of the module's name → style
MEGATRON_NAMES = ((".attention.self.query", "colwise"), (".attention.self.key", "colwise"),
                  (".attention.self.value", "colwise"), (".intermediate.dense", "colwise"),
                  (".attention.output.dense", "rowwise"), (".output.dense", "rowwise"))


@dataclass(frozen=True)
class Rule:
    module: str  # the module's name in the model
    style: str  # transformers' style name (TORCH_STYLES)
    source: str  # where the rule came from


def tensor_parallel_rules(model: Any, sp: bool = False) -> tuple[list[Rule], list[str]]:
    """Every module's rule, concrete (no wildcards), and notes on where the rules came from (`sp`: under sequence
    parallel, where a shared expert's rules differ)."""
    import torch

    modules = dict(model.named_modules())
    plan = dict(getattr(model, "tp_plan", None) or {})
    notes: list[str] = []
    rules: dict[str, Rule] = {}
    name = type(model).__name__
    if plan:
        plan = _packed_experts(plan)
        unmapped = sorted({s for s in plan.values() if s not in TORCH_STYLES + REPLICATED_STYLES + (EXPERTS_STYLE,)})
        if unmapped:
            experts = any("moe" in s or "packed" in s for s in unmapped)
            raise UnsupportedError(f"tensor parallel over {name}: transformers' plan uses {', '.join(unmapped)}, "
                                   "styles of its own with no torch ParallelStyle"
                                   + (" (the MoE experts' packed weights)" if experts else "")
                                   + "; trace it with shard='fsdp' and tp=1")
        class_plan = dict(getattr(type(model), "_tp_plan", None) or {})
        config = getattr(model, "config", None)
        configs = [config, text_config(config)] if config is not None else []
        config_plans = [(type(c).__name__, dict(getattr(c, "base_model_tp_plan", None) or {}))
                        for i, c in enumerate(configs) if c is not None and c not in configs[:i]]
        for pattern, style in plan.items():
            if pattern in class_plan:
                source = f"{name}._tp_plan"
            else:
                source = next((f"{owner}.base_model_tp_plan" for owner, entries in config_plans
                               if any(pattern == key or pattern.endswith("." + key) for key in entries)),
                              "transformers' default (init_parallel_plans)")
            regex = re.compile(re.escape(pattern).replace(r"\*", r"\d+"))
            for module_name in modules:
                if regex.fullmatch(module_name):
                    rules[module_name] = Rule(module_name, style, source)
    else:
        lists, _ = layer_lists(model)
        source = f"Megatron's names ({type(getattr(model, 'config', None)).__name__} has no base_model_tp_plan)"
        for list_name, _ in lists:
            for module_name, module in modules.items():
                if not module_name.startswith(list_name + "."):
                    continue
                if isinstance(module, torch.nn.Linear):
                    style = next((s for suffix, s in MEGATRON_NAMES if module_name.endswith(suffix)), None)
                else:
                    style = conv1d_rule(module_name, module)
                if style:
                    rules[module_name] = Rule(module_name, style, source)
        if not rules:
            raise UnsupportedError(f"tensor parallel over {name}: it has no base_model_tp_plan and none of its "
                                   "layers' modules has a Megatron name (query, key, value, dense; GPT-2's Conv1D "
                                   "attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj)")
        if any(rule.style in CONV1D_STYLES for rule in rules.values()):
            notes.append(f"{name} has no tensor-parallel plan in transformers: Megatron's cut of its Conv1D "
                         "projections (weights [in, out]) by module name: attn.c_attn column-parallel with the "
                         "fused q | k | v regrouped so each rank holds its heads' q, k and v (and bias), mlp.c_fc "
                         "column-parallel, attn.c_proj and mlp.c_proj row-parallel (bias replicated, added once)")
        else:
            notes.append(f"{name} has no tensor-parallel plan in transformers: a Megatron-style one from module "
                         "names (query, key, value and intermediate.dense colwise; attention.output.dense and "
                         "output.dense rowwise)")
    names = {module: n for n, module in modules.items()}
    embedding = _named(model, "get_input_embeddings", names)
    if embedding and embedding not in rules and isinstance(modules[embedding], torch.nn.Embedding):
        rules[embedding] = Rule(embedding, "embedding_rowwise", "Megatron's vocab-parallel input embedding")
    rules.update(_shared_expert_rules(rules, modules, sp))
    head = _named(model, "get_output_embeddings", names)
    if head and head not in rules and isinstance(modules[head], torch.nn.Linear):
        rules[head] = Rule(head, "colwise_gather_output",
                           "Megatron's vocab-parallel head, its output gathered as transformers' colwise_gather_output")
    return list(rules.values()), notes


def _packed_experts(plan: dict[str, str]) -> dict[str, str]:
    """transformers' plan with each packed-experts group folded into its module entry: `X.experts` moe_tp_experts
    with exactly `X.experts.gate_up_proj` packed_colwise and `X.experts.down_proj` rowwise (parameters, not modules)
    become the one module rule that PackedExpertsParallel applies; anything else packed stays, to be refused."""
    out = dict(plan)
    for pattern, style in plan.items():
        if style != EXPERTS_STYLE:
            continue
        entries = {f"{pattern}.{key}": value for key, value in PACKED_STYLES.items()}
        if all(plan.get(key) == value for key, value in entries.items()):
            for key in entries:
                del out[key]
    return out


def _shared_expert_rules(rules: dict[str, Rule], modules: dict[str, Any], sp: bool) -> dict[str, Rule]:
    """Megatron's cut of a shared expert beside packed experts (Qwen2-MoE's mlp.shared_expert: gate_proj and up_proj
    column-wise, down_proj row-wise), which transformers' plan leaves whole; its one-output gate stays replicated.
    Under sequence parallel the down projection's output stays Partial and the gate's a Replicate DTensor, so the
    block's gated sum reduce-scatters once with the experts' (moe_parallel.shared_expert_styles)."""
    import torch

    out = {}
    for rule in list(rules.values()):
        if rule.style != EXPERTS_STYLE:
            continue
        block = rule.module.rpartition(".")[0]
        down = SHARED_DOWN_STYLE if sp else "rowwise"
        for child, style in (("gate_proj", "colwise"), ("up_proj", "colwise"), ("down_proj", down)):
            name = f"{block}.shared_expert.{child}"
            if name not in rules and isinstance(modules.get(name), torch.nn.Linear):
                out[name] = Rule(name, style, "Megatron's shared expert (transformers' plan leaves it whole)")
        gate = f"{block}.shared_expert_gate"
        if sp and out and gate not in rules and isinstance(modules.get(gate), torch.nn.Linear):
            out[gate] = Rule(gate, SHARED_GATE_STYLE, "torchtitan's shared expert under sequence parallel (its "
                             "output Partial, summed with the experts'): the gate whole, its output Replicate")
    return out


def _named(model: Any, getter: str, names: dict[Any, str]) -> str | None:
    try:
        module = getattr(model, getter)()
    except (AttributeError, NotImplementedError, TypeError):
        return None
    return names.get(module)


def apply_tensor_parallel(model: Any, mesh: Any, tp: int, sp: bool, *, fsdp: bool = False) -> list[str]:
    """Shard the copy over the tp ranks with torch's parallelize_module; the notes name every rule and its source."""
    import torch
    from torch.distributed.tensor.parallel import parallelize_module

    rules, notes = tensor_parallel_rules(model, sp)
    modules = dict(model.named_modules())
    notes += _check_divisible(model, rules, modules, tp)
    notes += _replicate_kv_heads(model, rules, modules, tp)
    ties = _ties(model)
    for rule in rules:
        if rule.style == EXPERTS_STYLE:
            check_packed_experts(modules[rule.module], rule.module, tp)
        if rule.style == CONV1D_QKV:
            check_fused_qkv(modules[rule.module], rule.module, modules[rule.module.rpartition(".")[0]], tp)
    plan = {rule.module: _torch_style(rule.style, sp, tp) for rule in rules if rule.style not in REPLICATED_STYLES}
    if sp:
        plan.update(_sequence_parallel_plan(model, rules, modules, tp))
    parallelize_module(model, mesh, plan)
    for rule in rules:  # the attention's widths as the rank sees them (its fused output is h / t per q, k, v)
        if rule.style == CONV1D_QKV:
            localize_attention(modules[rule.module.rpartition(".")[0]], tp)
    for group in ties:  # parallelize_module replaces each parameter it shards: tie the others to the sharded one
        owners = [(modules[m], attribute) for m, attribute in group]
        sharded = next((getattr(o, a) for o, a in owners if _is_dtensor(getattr(o, a))), None)
        if sharded is not None:
            for owner, attribute in owners:
                if getattr(owner, attribute) is not sharded:
                    setattr(owner, attribute, sharded if isinstance(sharded, torch.nn.Parameter)
                            else torch.nn.Parameter(sharded))
    replicated = replicate_the_rest(model, mesh)
    by_source: dict[str, list[str]] = {}
    for rule in rules:
        by_source.setdefault(rule.source, []).append(f"{generic_name(rule.module)} {rule.style}")
    for source, entries in by_source.items():
        notes.append(f"tensor parallel over {tp} ranks, from {source}: " + ", ".join(dict.fromkeys(entries)))
    if sp:
        notes.append("sequence parallel: the embedding's output kept whole (transformers builds the mask and the "
                     "rotary tables from its length), the residual stream split on the sequence into the first "
                     "layer, the residual stream's norms SequenceParallel (pre-norm or post-norm, where the module "
                     "tree puts them), the input of each module holding column-parallel projections gathered "
                     "(attention and MLP), rowwise outputs Shard(1), the head's (and a pooler's) input gathered")
    if any(rule.style == EXPERTS_STYLE for rule in rules):
        notes.append("packed MoE experts cut as Megatron cuts each expert (paramscope's PackedExpertsParallel): "
                     f"gate_up_proj regrouped so each rank holds I/{tp} rows of every expert's gate and the same rows "
                     "of its up (Shard(1)), down_proj row-wise (Shard(2)), the router replicated, the experts' input "
                     "gradient all-reduced, their partial sums " + ("reduce-scattered on the sequence at the MoE "
                                                                    "block's output" if sp else "all-reduced"))
    embeddings = [rule.module for rule in rules if rule.style == "embedding_rowwise"]
    if embeddings and not fsdp:
        weight = modules[embeddings[0]].weight
        notes.append(f"torch's DTensor gives the vocab-parallel embedding's gradient Replicate: the whole "
                     f"{' × '.join(map(str, weight.shape))} gradient on each tp rank "
                     f"({weight.numel() * weight.element_size():,} B) until the optimizer step takes its shard")
    if replicated:
        notes.append(f"{', '.join(dict.fromkeys(map(generic_name, replicated)))} not sharded: replicated on every "
                     "tp rank, as DTensor Replicate (torch's distribute_module: same tensors, no copy) so that one "
                     "optimizer steps them beside the sharded ones")
    return notes


def replicate_the_rest(model: Any, mesh: Any) -> list[str]:
    """Make the parameters no rule sharded Replicate DTensors on the tp mesh, their modules taking and giving plain
    tensors (from_local and to_local: views, no copy); the names of the modules that hold them."""
    import torch
    from torch.distributed.tensor import DTensor, Replicate, distribute_module
    from torch.utils._pytree import tree_map

    def replicated(x: Any) -> Any:
        if isinstance(x, torch.Tensor) and not isinstance(x, DTensor):
            return DTensor.from_local(x, mesh, [Replicate()], run_check=False)
        return x

    def local(x: Any) -> Any:
        return x.to_local() if isinstance(x, DTensor) else x

    held = [(name, module) for name, module in model.named_modules()
            if any(not isinstance(p, DTensor) for p in module.parameters(recurse=False))]
    for _, module in held:
        def partition(_name: str, sub: Any, _mesh: Any, owner: Any = module) -> None:
            if sub is owner:
                for key, param in list(sub._parameters.items()):
                    if param is not None and not isinstance(param, DTensor):
                        sub.register_parameter(key, torch.nn.Parameter(replicated(param.data),
                                                                       requires_grad=param.requires_grad))

        distribute_module(module, mesh, partition, input_fn=lambda _m, inputs, _mesh: tree_map(replicated, inputs),
                          output_fn=lambda _m, outputs, _mesh: tree_map(local, outputs))
    return [name for name, _ in held]


def generic_name(name: str) -> str:
    return re.sub(r"\.\d+\.", ".*.", name)


def _is_dtensor(tensor: Any) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(tensor, DTensor)


def _torch_style(style: str, sp: bool, tp: int) -> Any:
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    if style == "colwise":
        return ColwiseParallel()
    if style == "rowwise":
        return RowwiseParallel(output_layouts=Shard(1)) if sp else RowwiseParallel()
    if style in ("colwise_gather_output", "colwise_rep"):
        return ColwiseParallel(input_layouts=Shard(1) if sp else Replicate(), output_layouts=Replicate())
    if style in ("rowwise_split_input", "rowwise_rep"):  # a whole input, split on the rank
        return RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1) if sp else Replicate())
    if style == "embedding_rowwise":
        return RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())
    if style == EXPERTS_STYLE:
        return packed_experts_style(sp)
    if style in (SHARED_DOWN_STYLE, SHARED_GATE_STYLE):
        return shared_expert_styles(style)
    if style in CONV1D_STYLES:
        return conv1d_style(style, sequence_parallel=sp, tp=tp)
    raise AssertionError(style)  # tensor_parallel_rules refuses every other style


def _ties(model: Any) -> list[list[tuple[str, str]]]:
    """The parameters held by more than one module, as [(module name, attribute)] groups."""
    holders: dict[int, list[tuple[str, str]]] = {}
    for module_name, module in model.named_modules(remove_duplicate=False):
        for attribute, param in module.named_parameters(recurse=False):
            holders.setdefault(id(param), []).append((module_name, attribute))
    return [list(dict.fromkeys(group)) for group in holders.values() if len(set(group)) > 1]


def _check_divisible(model: Any, rules: list[Rule], modules: dict[str, Any], tp: int) -> list[str]:
    """One line for a tp that does not divide the heads, the intermediate size, the KV heads (where they are not
    replicated) or a sharded width; a note for a vocabulary it does not divide (uneven shards, as DTensor keeps)."""
    config = text_config(getattr(model, "config", None))
    name = type(model).__name__
    heads, kv_heads, intermediate = dim(config, "heads"), dim(config, "kv_heads"), dim(config, "intermediate")
    if heads and heads % tp:
        raise OptionError("tp {tp} does not divide the {heads} attention heads of {name}", tp=tp, heads=heads,
                          name=name)
    if intermediate and intermediate % tp:
        raise OptionError("tp {tp} does not divide the intermediate size {size:,} of {name}", tp=tp,
                          size=intermediate, name=name)
    if kv_heads and kv_heads % tp and tp % kv_heads:
        raise OptionError("tp {tp} does not divide the {kv} KV heads of {name}, nor do they divide it (to "
                          "replicate them)", tp=tp, kv=kv_heads, name=name)
    notes = []
    for rule in rules:
        weight = getattr(modules[rule.module], "weight", None)
        if weight is None or rule.style in REPLICATED_STYLES + (SHARED_GATE_STYLE,):
            continue
        axis = (sharded_axis(rule.style) if rule.style in CONV1D_STYLES
                else 1 if rule.style.startswith("rowwise") else 0)
        width = weight.shape[axis]
        if width % tp == 0:
            continue
        if rule.style in ("embedding_rowwise", "colwise_gather_output"):
            notes.append(f"tp {tp} does not divide {rule.module}'s {width:,} rows: DTensor's uneven shards "
                         f"(ceil(rows / tp), the last rank's fewer); Megatron pads the vocabulary instead")
        elif not (rule.module.rsplit(".", 1)[-1] in ("k_proj", "v_proj") and kv_heads and tp % kv_heads == 0):
            raise OptionError("tp {tp} does not divide {module}'s {width:,} {what}", tp=tp, module=rule.module,
                              width=width, what="input features" if axis else "output features")
    return notes


def _replicate_kv_heads(model: Any, rules: list[Rule], modules: dict[str, Any], tp: int) -> list[str]:
    """With more tp ranks than KV heads, widen each k/v projection to tp heads (one per rank) before colwise
    sharding, so each rank holds the one KV head its query heads use, as Megatron replicates them."""
    import torch

    config = text_config(getattr(model, "config", None))
    heads, kv_heads = dim(config, "heads"), dim(config, "kv_heads")
    if not heads or not kv_heads or tp <= kv_heads:
        return []
    widened = []
    for rule in rules:
        if rule.style != "colwise" or rule.module.rsplit(".", 1)[-1] not in ("k_proj", "v_proj"):
            continue
        linear = modules[rule.module]
        head_dim = linear.weight.shape[0] // kv_heads
        for attribute in ("weight", "bias"):
            param = getattr(linear, attribute, None)
            if param is None:
                continue
            shape = (tp * head_dim, *param.shape[1:])
            setattr(linear, attribute, torch.nn.Parameter(param.new_empty(shape), requires_grad=param.requires_grad))
        linear.out_features = tp * head_dim
        attention = modules[rule.module.rpartition(".")[0]]
        if hasattr(attention, "num_key_value_groups"):
            attention.num_key_value_groups = heads // tp
        widened.append(rule.module)
    if not widened:
        return []
    return [f"tp {tp} is more than the {kv_heads} KV heads: each KV head replicated {tp // kv_heads}× (the k and v "
            f"projections widened to {tp} heads before colwise sharding), so each rank holds the one KV head its "
            f"{heads // tp} query heads use, as Megatron does"]


def _sequence_parallel_plan(model: Any, rules: list[Rule], modules: dict[str, Any], tp: int) -> dict[str, Any]:
    """The sequence-parallel styles beside the rules: the first layer's input split, the residual stream's norms
    SequenceParallel, each column-parallel projection's parent (the module that takes the residual stream in: a
    pre-norm decoder's self_attn and mlp, BERT's attention.self and intermediate) gathering its input, a pooler
    gathering its input, the final norms SequenceParallel.

    Read from the module tree rather than from a decoder template: where the norms sit follows, so post-norm BERT
    (its LayerNorms inside attention.output and output, after the residual add of the row-parallel output, Shard(1),
    and the layer's input, also Shard(1)) gets the same treatment as a pre-norm Llama. Norms inside a gathering
    module (Qwen3's per-head q_norm and k_norm) see whole sequences and stay replicated."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import SequenceParallel

    name = type(model).__name__
    lists, _ = layer_lists(model)
    if len(lists) != 1:
        raise UnsupportedError(f"sequence parallel over {name}: it has {len(lists)} lists of layers; one is traced")
    list_name, blocks = lists[0]
    layer_names = [f"{list_name}.{i}" for i in range(len(blocks))]
    gathering = {}  # the parents of the column-parallel projections inside a layer: they take the residual in
    for rule in rules:
        if not rule.style.startswith(("colwise", "conv1d_colwise")) and rule.style != EXPERTS_STYLE:
            continue
        parent = rule.module.rpartition(".")[0]
        if parent in layer_names:  # a projection straight under the layer: its input is the layer's, already split
            raise UnsupportedError(f"sequence parallel over {name}: {rule.module} sits straight under its layer, "
                                   "so no module's input can be gathered for it")
        if any(parent.startswith(layer + ".") for layer in layer_names):
            gathering[parent] = modules[parent]
    # a module inside one that gathers (Qwen2-MoE's mlp.shared_expert inside the MoE block) sees whole tokens already
    gathering = {n: m for n, m in gathering.items() if not any(n.startswith(g + ".") for g in gathering)}
    poolers = [n for n, m in modules.items() if n.rpartition(".")[2] == "pooler" and m is not None and
               not any(n.startswith(layer + ".") for layer in layer_names)]
    calls = _calls(model, [layer_names[0], *gathering, *poolers], modules, tp)
    plan: dict[str, Any] = {}
    plan[layer_names[0]] = _prepare(calls[layer_names[0]], Replicate(), Shard(1))
    experts_blocks = {rule.module.rpartition(".")[0] for rule in rules if rule.style == EXPERTS_STYLE}
    for block in [*gathering, *poolers]:
        plan[block] = (sequence_parallel_block(calls[block]) if block in experts_blocks
                       else _prepare(calls[block], Shard(1), Replicate()))
    for layer in layer_names:
        for child, module in modules[layer].named_modules():
            where = f"{layer}.{child}"
            if child and _is_norm(module) and not any(where.startswith(g + ".") for g in gathering):
                plan[where] = SequenceParallel(use_local_output=True)
    parent = list_name.rpartition(".")[0]
    # GPT-2's model views the final norm's output to the whole input shape (view(-1, seq, h)), which a rank's local
    # half-sequence would silently refold into half the batch: there the output stays a Shard(1) DTensor (its shape
    # the whole sequence) until the head's input gathers it
    conv1d = any(rule.style in CONV1D_STYLES for rule in rules)
    for child, module in (modules[parent] if parent else model).named_children():
        if _is_norm(module):
            plan[f"{parent}.{child}" if parent else child] = SequenceParallel(use_local_output=not conv1d)
    return plan


def _is_norm(module: Any) -> bool:
    return "norm" in type(module).__name__.lower()


def _prepare(call: tuple[int, str | None], given: Any, wanted: Any) -> Any:
    """PrepareModuleInput for a block called with its hidden states first by position, or by keyword `name`."""
    from torch.distributed.tensor.parallel import PrepareModuleInput

    positional, keyword = call
    if keyword is not None:
        return PrepareModuleInput(input_kwarg_layouts={keyword: given}, desired_input_kwarg_layouts={keyword: wanted},
                                  use_local_output=True)
    rest = (None,) * (positional - 1)
    return PrepareModuleInput(input_layouts=(given, *rest), desired_input_layouts=(wanted, *rest),
                              use_local_output=True)


def _calls(model: Any, names: list[str], modules: dict[str, Any], tp: int) -> dict[str, tuple[int, str | None]]:
    """How each named module is called, from one probe forward on `tp` tokens: (positional arguments, the keyword
    of its first parameter when the hidden states come by keyword, else None)."""
    import inspect

    import torch

    seen: dict[str, tuple[int, str | None]] = {}
    handles = []
    for name in names:
        module = modules[name]
        first = next(iter(inspect.signature(module.forward).parameters), None)

        def record(_module, args, kwargs, name=name, first=first):  # noqa: ANN001 - torch's hook signature
            if name not in seen:
                seen[name] = (len(args), first if not args and first in kwargs else None)

        handles.append(module.register_forward_pre_hook(record, with_kwargs=True))
    try:
        with torch.no_grad():
            model(input_ids=torch.zeros((1, tp), dtype=torch.long))
    finally:
        for handle in handles:
            handle.remove()
    missing = [name for name in names if name not in seen or (seen[name][0] == 0 and seen[name][1] is None)]
    if missing:
        raise UnsupportedError(f"sequence parallel over {type(model).__name__}: cannot tell how "
                               f"{', '.join(missing)} receive their hidden states")
    return seen
