"""One device's FLOPs per step under a multi-GPU layout, split from the analytic count weight by weight.

    analytic_flops(…, parts=) (flops/analytic.py: each matmul weight's forward FLOPs, the same count as its terms)
    → each weight's tensor/expert-parallel cut (rules.py) and pipeline stage (pipeline.py)
    → each device's forward, backward and recompute; the stage and tensor-parallel rank doing the most
    → the sum over the replica's devices, against the model's count (the invariant below)

The figures are one device's for one step: its stage's layers over every microbatch (each microbatch is batch / m
sequences, so m microbatches make the replica's batch), at its context-parallel share of the tokens.

- tensor parallel (tp): a column- or row-cut matmul costs 1/tp of its FLOPs on each rank; the vocabulary-parallel
  head ⌈V/tp⌉ rows on rank 0 (the last ranks fewer, where tp does not divide V); attention scores run on heads/tp
  heads. Replicated matmuls (routers, MLA's down projections, anything the rules keep whole) run whole on every rank:
  duplicated tp times; KV projections replicated past the KV heads run tp/kv times.
- sequence parallel (sp): norms and the residual stream run on S/tp tokens, but norms are elementwise, which the
  convention does not count: sp changes no FLOP figure.
- context parallel (cp): each rank's S/cp query tokens meet all S keys over the ring: matmuls and scores 1/cp each.
  Causal masks: the load-balanced split (rank i holds chunks i and 2cp − 1 − i of 2cp, Megatron's and torch's
  context_parallel), whose ranks do equal work: each 1/cp of the masked scores, under the full or half convention.
- expert parallel (ep): balanced routing assumed: the tokens' top-k assignments spread evenly over the experts, so a
  rank's E/ep experts receive k/E of its group's tokens × ep: the same expert FLOPs as without ep (all-to-all moves
  tokens, not FLOPs). Under an uneven load (`layout.expert_load` F > 1, traced/expert_parallel.py's routes) the
  busiest rank's experts receive ⌈F·S⌉ of its balanced S = (batch / m)·(S_tokens / cp)·k token-expert pairs a MoE
  layer and microbatch (under cp the ep ranks are drawn from the cp ranks, each routing the tokens it holds), so
  each routed expert weight's FLOPs on it are its balanced ones × ⌈F·S⌉ / S (a grouped matmul costs 2 × rows × in ×
  out, whatever the groups); the others receive fewer (not the busiest). Beside tp each tp rank of
  the busiest ep rank runs its I / tp slice of those pairs (every tp rank holds the replica's tokens at the experts).
  A layout's step ends when its busiest rank's does: its figures are the ones shown, and the MFU per device is its.
- pipeline (pp): each stage its layers (embeddings on the first, final norm and head on the last); the bubble,
  (pp − 1) / (v·m + pp − 1) of the step, is idle time, in the step time and not in the FLOPs. Without training the
  stages run forwards only: no backward, so no schedule (1F1B, GPipe, interleaved are training's) and no bubble
  counted (a serving engine keeps a batch in flight on every stage, as vLLM's pipeline parallel does); microbatches
  and a schedule are refused there (FlopOptions.check).
- recompute: the backward's rerun of flash attention's scores (½ × the scores' forward) and, with full gradient
  checkpointing, each layer's forward once more (less the last matmul nothing after it saves), as the analytic
  engine counts them: hardware FLOPs, beside the model FLOPs (PaLM's convention: MFU excludes recompute; HFU has it).

The invariant (tested exactly): over the tp × pp × cp devices of one data-parallel replica,

    Σ device model FLOPs = the model's FLOPs at the replica's batch + Σ over whole-kept matmuls (copies − 1) × theirs

where copies is tp for a replicated weight, tp / kv for a KV projection replicated past the kv heads, 1 for a cut.
Under an uneven expert load the sum is at balanced routing (the ep ranks' pairs sum to the same; the busiest rank's
own figures are above its balanced share by `loaded`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from ...errors import OptionError, UnsupportedError
from ...words import counted
from .layout import ParallelLayout
from .pipeline import Stage, bubble, layer_of, layer_stack_of, split_words, stages
from .rules import Placement, model_shape, place

_NO_ATTENTION = ("none", "linear_attention", "mamba", "conv", "recurrent", "shared")


@dataclass(frozen=True)
class DeviceTerm:
    """One role's forward FLOPs on the device, beside the replica's."""

    role: str
    flops: int  # on the device (its stage, tp rank and cp share)
    whole: int  # the model's, at the replica's batch
    rule: str  # how tensor parallelism cuts it, in words
    copies: int  # tp ranks computing the same FLOPs: 1 when cut, tp when kept whole


@dataclass(frozen=True)
class StageFlops:
    """One pipeline stage's device (tensor-parallel rank 0, which holds the most vocabulary rows)."""

    rank: int
    layers: tuple[int, int] | None  # (first, last) layer index; None: none
    layer_count: int
    first: bool
    last: bool
    forward: int
    backward: int | None
    recompute: int | None

    @property
    def step(self) -> int:
        return self.forward + (self.backward or 0)


@dataclass(frozen=True)
class DeviceFlops:
    """One device's FLOPs per step under `layout`: the stage and tensor-parallel rank doing the most."""

    layout: ParallelLayout
    batch: int  # sequences a data-parallel replica takes a step
    seq: int
    tokens: int  # query tokens the device processes a step: batch × seq / cp
    stage: int  # the pipeline stage shown (the most FLOPs)
    terms: tuple[DeviceTerm, ...]  # by role, summing to forward
    forward: int
    backward: int | None  # model FLOPs (training)
    recompute: int | None  # hardware FLOPs beyond the model's (training)
    stages: tuple[StageFlops, ...]  # each stage's busiest rank
    replica: int  # the model's FLOPs for the replica's batch: step (training) or forward
    devices_sum: int  # Σ over the replica's tp × pp × cp devices of their model FLOPs
    duplicated: int  # what the whole-kept matmuls add to that sum: Σ (copies − 1) × their FLOPs
    recompute_sum: int | None  # Σ over the replica's devices of their recompute
    bubble: float
    split: str  # the pipeline split in words ("" without one)
    conventions: tuple[str, ...] = field(default=())
    notes: tuple[str, ...] = field(default=())
    loaded: int = 0  # under an uneven expert load: forward FLOPs the busiest rank runs beyond its balanced share
    pairs: tuple[int, int] | None = None  # under an uneven expert load: (⌈F·S⌉, S) token-expert pairs a MoE layer

    @property
    def forward_only(self) -> bool:
        """No training: the layout runs forwards (serving), with no backward schedule and no bubble."""
        return self.backward is None

    @property
    def layout_words(self) -> str:
        """The layout in words: its schedule under training, "pp 2 (forward only)" else."""
        return self.layout.words(schedule=not self.forward_only)

    @property
    def stages_words(self) -> str:
        """The pipeline's split and what it idles: the bubble under training; forward only, none counted."""
        layout = self.layout
        if self.forward_only:
            return (f"{self.split}; forward only: no backward, so no schedule and no bubble counted (a serving "
                    "engine keeps a batch in flight on every stage, as vLLM's pipeline parallel does)")
        return (f"{self.split}; bubble {100 * self.bubble:.1f}% of the step idle: (pp − 1) / (v·m + pp − 1) = "
                f"{layout.pp - 1} / ({layout.virtual_stages}·{layout.micro_batches} + {layout.pp - 1}), time not "
                "FLOPs")

    @property
    def step(self) -> int:
        """Model FLOPs a step: forward + backward (training), else the forward."""
        return self.forward + (self.backward or 0)

    @property
    def hardware(self) -> int:
        """With the recompute: what the device runs."""
        return self.step + (self.recompute or 0)

    @property
    def per_microbatch(self) -> int:
        return self.step // self.layout.micro_batches


def device_flops(estimate: Any, parts: Any, report: Any, view: Any, layout: ParallelLayout, *,
                 checkpointing: bool, causal_model: bool) -> DeviceFlops:
    """The device's FLOPs from the analytic `estimate` at the replica's batch and `parts`, the same count weight by
    weight (analytic.Parts)."""
    from ..dims import text_config
    from ..memory.kv import layer_kinds

    if parts.unsplit:
        raise UnsupportedError("per-device FLOPs under a layout are not split for {name}: {why}",
                               name=view.class_name, why=parts.unsplit)
    training = estimate.backward is not None
    if training and estimate.backward != 2 * estimate.forward:
        raise UnsupportedError("per-device FLOPs under a layout need a backward of 2 × forward; here it is "
                               "{backward:,} ({why})", backward=estimate.backward,
                               why="; ".join(estimate.notes[-1:]) or "frozen or unused weights")
    if not training and layout.micro_batches_default and layout.micro_batches > 1:
        # a forward's pipeline takes no microbatches (FlopOptions.check refuses them given): the default, one a
        # sequence, is a training schedule's, and the stages run the replica's batch
        layout = dataclasses.replace(layout, micro_batches=1)
    tp, cp, pp = layout.tp, layout.cp, layout.pp
    seq = estimate.seq
    load = layout.expert_load if layout.ep > 1 else 1
    if cp > 1:
        chunks = 2 * cp if causal_model else cp
        if seq % chunks:
            raise OptionError("{0} {cp} splits each sequence into {chunks} equal chunks{why}: {seq:,} tokens are "
                              "not a multiple of {chunks}", "cp", cp=cp, chunks=chunks, seq=seq,
                              why=" (the load-balanced causal split, 2 a rank)" if causal_model else "")
        once = sorted({role for _, role, _, _, once in parts.matmuls if once})
        if once:
            raise UnsupportedError("{0} splits the sequence, and {roles} read one token of each sequence (on one "
                                   "context-parallel rank): not modelled", "cp", roles=", ".join(once))
    config = text_config(view.config)
    classes = {sub.__class__.__name__ for _, sub in view.root.named_modules()} if view.root is not None else set()
    placements = place(report.params, model_shape(config, classes), tp=tp, ep=layout.ep)
    by_name: dict[str, Placement] = {}
    for param, placement in zip(report.params, placements):
        for name in (param.name, *param.aliases):
            by_name[name] = placement

    kinds = layer_kinds(config)
    attention_layers = [i for i, (kind, _) in enumerate(kinds) if kind not in _NO_ATTENTION]
    per_layer, rest = divmod(estimate.attention, len(attention_layers)) if attention_layers else (0, 0)
    if rest or (estimate.attention and not attention_layers):
        raise UnsupportedError("the attention scores do not split evenly over {layers} attention layers here",
                               layers=len(attention_layers))
    if pp > 1:
        stack, count = layer_stack_of([p.name for p in report.params])
        if count != len(kinds):
            raise UnsupportedError("the layer stack {stack} has {count} layers and the config {kinds}: pipeline "
                                   "stages not split", stack=stack, count=count, kinds=len(kinds))
        plan = stages(layout, count)
    else:
        stack, plan = None, (Stage(0, tuple(range(len(kinds))), (len(kinds),), True, True, 1),)
    stage_of_layer = {index: stage.rank for stage in plan for index in stage.layers}

    # each weight: (role, forward FLOPs, stage, rerun under checkpointing, placement)
    weights = []
    for name, role, flops, in_layer, _ in parts.matmuls:
        index = layer_of(name, stack) if stack is not None else None
        if stack is None:
            where = 0
        elif index is not None:
            where = stage_of_layer[index]
        else:
            where = 0 if role.startswith("embeddings") else pp - 1
        rerun = in_layer and name not in parts.not_rerun
        weights.append((role, flops, where, rerun, by_name.get(name)))
    if sum(w[1] for w in weights) + estimate.attention != estimate.forward:
        raise UnsupportedError("the analytic terms of {name} do not split weight by weight here",
                               name=view.class_name)

    def cut(placement: Placement | None, rank: int) -> tuple[int, int, int]:
        """(numerator, denominator, copies): the share of a weight's FLOPs tp rank `rank` runs, and how many tp
        ranks run the same FLOPs."""
        if placement is None or tp == 1 or placement.tp_dim is None or placement.tp == "replicated":
            return 1, 1, tp
        size = placement.shape[placement.tp_dim]
        if placement.tp == "vocabulary":
            rows = -(-size // tp)
            return max(0, min(rows, size - rank * rows)), size, 1
        local = placement.local_shape[placement.tp_dim]
        return local, size, tp * local // size

    def exact(value: int, numerator: int, denominator: int) -> int:
        whole, left = divmod(value * numerator, denominator)
        if left:
            raise UnsupportedError("a per-device share does not divide exactly ({value:,} × {num} / {den})",
                                   value=value, num=numerator, den=denominator)
        return whole

    fused = parts.fused_attention
    multiplier = 3 if training else 1  # forward + backward (2 × forward) for what trains
    pairs = None
    if load != 1:
        from ..dims import dim
        from ..traced.expert_parallel import busiest_pairs

        if not any(placement is not None and placement.experts_split for *_, placement in weights):
            raise UnsupportedError("expert load {load:g}: {name} has no routed experts for the ep ranks to share",
                                   load=load, name=view.class_name)
        top_k = dim(config, "top_k")
        if not top_k:
            raise UnsupportedError("expert load {load:g}: {name}'s config names no top-k (experts a token is routed "
                                   "to), so its token-expert pairs are not counted", load=load, name=view.class_name)
        # the rank's own pairs: its microbatch's sequences at its S / cp tokens (the ep ranks are drawn from the cp
        # ranks, torchtitan's dp_shard_in_ep × cp: each routes only the tokens it holds)
        balanced = estimate.batch // layout.micro_batches * (seq // cp) * top_k
        pairs = (busiest_pairs(balanced, layout.ep, load), balanced)  # a MoE layer's, a microbatch

    def on_device(stage: Stage, rank: int, routed: tuple[int, int] | None) -> tuple[dict[str, int], int, int]:
        """(forward by role, forward, recompute) of tp rank `rank` of `stage`, for one cp rank; `routed`: (pairs
        received, balanced pairs) of the busiest ep rank, or None for balanced routing."""
        roles: dict[str, int] = {}
        recompute = 0
        for role, flops, where, rerun, placement in weights:
            if where != stage.rank:
                continue
            numerator, denominator, _ = cut(placement, rank)
            if routed is not None and placement is not None and placement.experts_split:
                numerator, denominator = numerator * routed[0], denominator * routed[1]
            share = exact(flops, numerator, denominator * cp)
            roles[role] = roles.get(role, 0) + share
            if checkpointing and rerun:
                recompute += share
        held = sum(1 for index in stage.layers if index in set(attention_layers))
        attention = exact(held * per_layer, 1, tp * cp)
        if attention:
            roles["attention.scores"] = attention
        if training:
            recompute += (attention // 2 if fused else 0) + (attention if checkpointing else 0)
        return roles, sum(roles.values()), recompute

    per_stage = []
    devices_sum = recompute_sum = 0
    for stage in plan:
        for rank in range(tp):
            roles, forward, recompute = on_device(stage, rank, None)
            devices_sum += cp * multiplier * forward
            recompute_sum += cp * recompute
            if rank == 0:
                per_stage.append((stage, roles, forward, recompute) if pairs is None else
                                 (stage, *on_device(stage, rank, pairs), forward))
    duplicated = sum(multiplier * flops * (cut(placement, 0)[2] - 1) for _, flops, _, _, placement in weights)
    worst = max(per_stage, key=lambda entry: (entry[2], -entry[0].rank))
    stage, roles, forward, recompute = worst[:4]
    loaded = forward - worst[4] if pairs is not None else 0

    whole_by_role: dict[str, int] = {}
    rules_of: dict[str, dict[str, int]] = {}  # role → its weights' rules in words → copies
    for role, flops, _, _, placement in weights:
        whole_by_role[role] = whole_by_role.get(role, 0) + flops
        rules_of.setdefault(role, {})[_rule_words(placement, tp)] = cut(placement, 0)[2]
    split_experts = {role for role, *_, placement in weights if placement is not None and placement.experts_split}
    routing = (f"; experts / ep {layout.ep}, the busiest rank: ⌈{load:g}·S⌉ = {pairs[0]:,} of its balanced "
               f"S = {pairs[1]:,} token-expert pairs a layer" if pairs is not None else
               f"; experts / ep {layout.ep}, balanced routing: the same FLOPs")
    rule_by_role = {role: ("; ".join(rules) + (routing if role in split_experts else ""), max(rules.values()))
                    for role, rules in rules_of.items()}
    if estimate.attention:
        whole_by_role["attention.scores"] = estimate.attention
        rule_by_role["attention.scores"] = (f"heads / {tp}" if tp > 1 else "whole", 1)
    terms = tuple(DeviceTerm(role, roles.get(role, 0), whole_by_role[role], *rule_by_role[role])
                  for role in sorted(whole_by_role, key=lambda r: (-roles.get(r, 0), -whole_by_role[r], r)))

    stage_figures = tuple(StageFlops(s.rank, (min(s.layers), max(s.layers)) if s.layers else None, len(s.layers),
                                     s.first, s.last, f, 2 * f if training else None, r if training else None)
                          for s, _, f, r, *_ in per_stage)
    return DeviceFlops(layout, estimate.batch, seq, estimate.batch * seq // cp, stage.rank, terms, forward,
                       2 * forward if training else None, recompute if training else None, stage_figures,
                       estimate.step if training else estimate.forward, devices_sum, duplicated,
                       recompute_sum if training else None, bubble(layout) if training else 0.0,
                       split_words(layout, len(kinds)) if pp > 1 else "",
                       _conventions(layout, causal_model, estimate.causal, weights, tp,
                                    [name for name, *_ in parts.matmuls], pairs, training), (), loaded, pairs)


def _rule_words(placement: Placement | None, tp: int) -> str:
    if tp == 1:
        return "whole"
    if placement is None or placement.tp_dim is None or placement.tp == "replicated":
        return f"replicated: whole on each of {tp} tp ranks"
    return {"column": f"column-parallel: output / {tp}", "row": f"row-parallel: input / {tp}",
            "vocabulary": f"vocabulary-parallel: ⌈V / {tp}⌉ rows on rank 0",
            "kv-replicated": "KV heads replicated: one KV head a rank"}[placement.tp]


def _conventions(layout: ParallelLayout, causal_model: bool, causal: str, weights: list, tp: int,
                 names: list[str], pairs: tuple[int, int] | None, training: bool) -> tuple[str, ...]:
    out = []
    if tp > 1:
        def kept(placement: Placement | None) -> bool:
            return placement is None or placement.tp_dim is None or placement.tp == "replicated"

        mixed = {role for role, *_, placement in weights if not kept(placement)}
        whole = sorted({role if role not in mixed else f"{role} ({name.rsplit('.', 2)[-2]})"
                        for name, (role, *_, placement) in zip(names, weights) if kept(placement)})
        kv = sorted({role for role, _, _, _, placement in weights
                     if placement is not None and placement.tp == "kv-replicated"})
        text = (f"tensor parallel: column- and row-cut matmuls and the attention heads / {tp} on each rank, the "
                f"vocabulary-parallel head ⌈V / {tp}⌉ rows on rank 0")
        if whole:
            text += f"; kept whole and duplicated on every tp rank: {', '.join(whole)}"
        if kv:
            text += f"; {', '.join(kv)} replicated past the KV heads (each KV head's projection on tp / kv ranks)"
        out.append(text)
    if layout.sp:
        out.append("sequence parallel: norms and the residual stream run on S / tp tokens, but norms are "
                   "elementwise and not counted: --sp changes no FLOP figure")
    if layout.cp > 1:
        text = (f"context parallel: each rank's S / {layout.cp} query tokens against all S keys (ring attention): "
                f"matmuls and scores / {layout.cp}")
        if causal_model:
            text += (f"; causal: the load-balanced split (rank i holds chunks i and {2 * layout.cp - 1} − i of "
                     f"{2 * layout.cp}, Megatron's and torch's), whose ranks do equal work, so each does the "
                     f"average, 1 / {layout.cp} of the {'halved' if causal == 'half' else 'full'} scores")
        out.append(text)
    if pairs is not None:
        load, ep = layout.expert_load, layout.ep
        out.append(f"expert parallel, an uneven load (a convention, --expert-load {load:g}): the busiest rank's "
                   f"experts (/ {ep}) receive {load:g} × its balanced share, ⌈{load:g}·S⌉ = {pairs[0]:,} of S = "
                   f"B·T·k = {pairs[1]:,} token-expert pairs a MoE layer{' and microbatch' if layout.pp > 1 else ''}"
                   + (f" (T = S / {layout.cp}: the rank's own tokens under context parallel)" if layout.cp > 1 else "")
                   + f", so its expert FLOPs are × {pairs[0]:,} / {pairs[1]:,}; the other {ep - 1} ranks receive "
                   f"{ep * pairs[1] - pairs[0]:,} between them, fewer than S each. A step ends when its busiest rank's "
                   "does: the figures (and the MFU per device) are that rank's, and so is the layout's step time")
    elif layout.ep > 1:
        out.append(f"expert parallel: balanced routing assumed: each rank's routed experts (/ {layout.ep}) receive "
                   "an even share of its group's top-k assignments, so a device's expert FLOPs are its own "
                   "tokens' top-k share, as without ep (the all-to-all moves tokens, not FLOPs)")
    if layout.pp > 1 and not training:
        out.append("pipeline, forward only: each stage runs its layers' forward over the replica's batch; no "
                   "backward, so no schedule and no bubble counted")
    elif layout.pp > 1:
        out.append("pipeline: each stage's layers over " + "all " * (layout.micro_batches > 1)
                   + counted(layout.micro_batches, "microbatch", "microbatches") + " of batch / m sequences; the "
                   "bubble is idle time, counted in the step time, not in FLOPs")
    if layout.dp > 1 or layout.shard != "none":
        out.append(f"data parallel: each of {layout.dp} replicas does these FLOPs on its own batch; ZeRO and FSDP "
                   "change communication and memory, not FLOPs")
    return tuple(out)
