"""Each device's communication a step, by kind, each a bound: the layout search shows the stage whose device moves
the most.

What one device sends (and as much it receives) a step, ring algorithms over a group of n ranks, a buffer of X
bytes: all-gather and reduce-scatter (n − 1)/n · X each, all-reduce 2(n − 1)/n · X; rounded up to a byte:

    DP   P, G = the device's parameters and gradients before any data-parallel share, in the dtype they are trained
         in (fp32 under mixed precision); routed experts apart (Pe, Ge) over their own n_e = n / ep ranks, the rest
         (Pd, Gd) over n = dp × cp. Under FSDP2 each parameter padded as fully_shard pads it, ⌈dim0 / n⌉·n rows
         (a rank's packed experts over more ranks than it holds: ⌈dim1 / n_e⌉·n_e), and P is what it gathers:
         under torch.autocast (--fsdp-mixed-precision autocast) the fp32 parameters, 4 B an element; under its
         MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32) (policy, torchtitan's) the 16-bit ones, 2 B an
         element; G is reduce-scattered in fp32 (4 B an element) under both
         DDP (no sharding)   all-reduce of the gradients                         2(n−1)/n · G
         ZeRO-1, ZeRO-2      reduce-scatter of the gradients, all-gather of the updated parameters   (n−1)/n · (G + P)
         ZeRO-3, FSDP2       all-gather of the parameters in forward and again in backward, reduce-scatter of the
                             gradients                                           (n−1)/n · (2P + G)
         FSDP2 hybrid        the same inside a shard group of g, then all-reduce of the gradient shard across the
                             r = n / g groups                (g−1)/g · (2P + G) + 2(r−1)/r · G/g
         FSDP2 beside pp     a stage's units gathered once, at its first forward (torchtitan: reshard_after_forward
                             False under a pipeline), kept through every microbatch's backward (torch's PipelineStage:
                             set_reshard_after_backward(False), no gradient sync), the gradients reduce-scattered once
                             after the last backward (perform_reduce_grad)    (n−1)/n · (P + G)  (hybrid: P for 2P)
         bf16-main-grad (Megatron-LM's) G = the fp32 main_grad, 4 B an element, P = the bf16 parameters, 2 B: DDP
                             2(n−1)/n · G; the distributed optimizer (n−1)/n · (G + P); once a step under accumulation
    TP   X = b·s·h × a (a microbatch's tokens on the rank: b = the microbatch, s = S / cp; a = 2 B under mixed or
         bf16 precision, 4 B in fp32); per layer 2 all-reduces forward and 2 backward (Megatron; with sequence
         parallel each is an all-gather and a reduce-scatter: the same bytes); the vocabulary-parallel embedding's
         forward and the head's input gradient one more each on the first and last stage; full checkpointing reruns
         the forward's 2 a layer:        c · 2(t−1)/t · X per microbatch, c = 4·L (+2·L recomputed) (+1 first) (+1 last)
    PP   Y = b·s·h × r / t (the residual stream between stages: r = 4 B under mixed precision, 2 B under FSDP2's
         MixedPrecisionPolicy, sp's 1/t piece a rank):
         each microbatch's activation sent forward and its gradient sent back, at every chunk boundary the device
         holds;                          (v − [last]) + (v − [first]) sends of Y per microbatch
         a tied embedding under pp: its gradient all-reduced between the first and last stage, E (the shard's bytes)
    EP   the routed tokens' all-to-all, dispatch and combine, forward and backward (+2 recomputed), the share leaving
         the rank under balanced routing: 4 · (e−1)/e · k·T·h × a a MoE layer and microbatch, T = b·s / t tokens
    CP   ring attention: K and V of the rank's chunk passed cp − 1 times a layer forward, K, V and their gradients
         backward (+1 recomputed): 3 · (cp−1) · 2·b·s·kv·hd × a a layer and microbatch (kv = the rank's KV heads)
Left out: the loss's vocabulary-parallel max and sum (8 B a token), the optimizer's gradient-norm all-reduce, and
MoE routers' load-balancing statistics: bytes per token or per step, well under 0.1%.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from ..memory.states import MAIN_GRAD_PRECISION, MASTER_PRECISION
from .layout import ParallelLayout, shard_words
from .layout_facts import ModelFacts
from .pipeline import Stage, params_held, stages
from .states import bf16_optimizer
from .search_result import CommTerm

# a parameter group's bytes as FSDP2 moves them: (all-gathered, reduce-scattered); ints where no FSDP2 (the same bytes)
Moved = tuple[int, int]


def _fsdp(layout: ParallelLayout) -> bool:
    return layout.shard in ("fsdp", "hsdp") and layout.shard_degree > 1


class StepCommunication:
    """The communication of each layout's busiest device, with each pipeline's stage bytes computed once."""

    def __init__(self, facts: ModelFacts) -> None:
        self.facts = facts
        self._stage_bytes: dict[tuple[int, int, int, int], list[tuple[Stage, int, int, int]]] = {}
        self._fsdp_bytes: dict[tuple, list[tuple[Moved, Moved]]] = {}

    def busiest(self, layout: ParallelLayout, replica: int, steps: int = 1) -> tuple[int, tuple[CommTerm, ...]]:
        """(the stage whose device moves the most, its terms); `steps`: the micro-steps of gradient accumulation
        (the data-parallel collectives run in each)."""
        facts = self.facts
        best: tuple[int, tuple[CommTerm, ...]] | None = None
        gathered = self.fsdp_bytes(layout) if _fsdp(layout) else None
        for index, (stage, dense, experts, tied) in enumerate(self.stage_bytes(layout)):
            moved = (dense, experts) if gathered is None else gathered[index]
            precision = facts.options.precision
            if precision == MAIN_GRAD_PRECISION:
                data = main_grad_dp_terms(layout, dense, experts, steps)
            elif precision == MASTER_PRECISION and layout.zero_stage == 0:
                data = deepspeed_zero0_dp_terms(layout, dense, experts, steps)
            else:
                data = dp_terms(layout, *moved, steps)
            terms = tuple(t for t in (*data, tp_term(facts, layout, replica, stage),
                                      *pp_terms(facts, layout, replica, stage, tied),
                                      ep_term(facts, layout, replica, stage), cp_term(facts, layout, replica, stage))
                          if t is not None)
            if best is None or sum(t.bytes for t in terms) > sum(t.bytes for t in best[1]):
                best = (stage.rank, terms)
        assert best is not None
        return best

    def stage_bytes(self, layout: ParallelLayout) -> list[tuple[Stage, int, int, int]]:
        """For each pipeline stage: (the stage, its dense parameters' bytes, its routed experts' bytes, a tied
        embedding copy's bytes), rank 0's tensor/expert-parallel shards in the dtype they train in."""
        key = (layout.tp, layout.ep, layout.pp, layout.virtual_stages)
        if key in self._stage_bytes:
            return self._stage_bytes[key]
        from ..dtypes import itemsize
        from ..memory.states import trained_dtype

        facts = self.facts
        by_name = {p.name: p for p in facts.placements(layout.tp, layout.ep)}

        def size(p: Any) -> int:
            return p.local_numel * itemsize(trained_dtype(p, facts.options.precision))  # type: ignore[arg-type]

        if layout.pp > 1:
            plan = stages(layout, facts.layers)
        else:
            plan = (Stage(0, tuple(range(facts.layers)), (facts.layers,), True, True, 1),)
        out = []
        for stage in plan:
            held = params_held(facts.report.params, facts.stack, stage) if layout.pp > 1 else facts.report.params
            dense = experts = 0
            for param in held:
                placement = by_name[param.name]
                if placement.experts_split:
                    experts += size(placement)
                else:
                    dense += size(placement)
            tied = 0
            if layout.pp > 1 and facts.tied in by_name and by_name[facts.tied].role.startswith("embedding"):
                tied = size(by_name[facts.tied])
                if stage.last:
                    dense += tied
            out.append((stage, dense, experts, tied if (stage.first or stage.last) else 0))
        self._stage_bytes[key] = out
        return out

    def fsdp_bytes(self, layout: ParallelLayout) -> list[tuple[Moved, Moved]]:
        """For each pipeline stage under FSDP2: (its dense parameters, its routed experts) as fully_shard moves them,
        each (the bytes all-gathered, the bytes reduce-scattered) before the ring's (n − 1)/n: every parameter
        padded as fully_shard pads it (⌈dim0 / n⌉·n rows over the n = shard degree ranks; a rank's packed experts
        over n_e = n / ep ranks, ⌈dim1 / n_e⌉·n_e where n_e exceeds its experts, torchtitan's Shard(1)), gathered
        in the dtype the convention gathers (fp32 as trained under autocast, the policy's 16-bit param_dtype) and
        reduced in fp32 (the trained dtype; the policy's reduce_dtype)."""
        policy = layout.fsdp_mixed_precision == "policy"
        n = layout.shard_degree
        n_e = max(1, n // layout.ep)
        key = (layout.tp, layout.ep, layout.pp, layout.virtual_stages, n, policy)
        if key in self._fsdp_bytes:
            return self._fsdp_bytes[key]
        from ..dtypes import itemsize
        from ..memory.states import trained_dtype

        facts = self.facts
        by_name = {p.name: p for p in facts.placements(layout.tp, layout.ep)}
        precision = facts.options.precision

        def moved(p: Any) -> Moved:
            shape = p.local_shape or (1,)
            if p.experts_split and len(shape) == 3 and n_e > shape[0]:
                elements = shape[0] * _ceil(shape[1], n_e) * n_e * shape[2]
            else:
                d = n_e if p.experts_split else n
                elements = _ceil(shape[0], d) * d * math.prod(shape[1:])
            trained = itemsize(trained_dtype(p, precision))  # type: ignore[arg-type]
            return (elements * (2 if policy else trained), elements * trained)

        out = []
        for stage, _, _, _ in self.stage_bytes(layout):
            held = params_held(facts.report.params, facts.stack, stage) if layout.pp > 1 else facts.report.params
            names = [p.name for p in held]
            if layout.pp > 1 and stage.last and facts.tied in by_name and \
                    by_name[facts.tied].role.startswith("embedding"):
                names.append(facts.tied)  # the last stage's copy of the tied embedding (Megatron's rule)
            dense, experts = [0, 0], [0, 0]
            for name in names:
                gather, reduce = moved(by_name[name])
                total = experts if by_name[name].experts_split else dense
                total[0] += gather
                total[1] += reduce
            out.append(((dense[0], dense[1]), (experts[0], experts[1])))
        self._fsdp_bytes[key] = out
        return out


def dp_terms(layout: ParallelLayout, dense: int | Moved, experts: int | Moved, steps: int = 1) -> list[CommTerm]:
    """The data-parallel collectives: the dense parameters over the dp × cp ranks holding them, the routed
    experts over the dp × cp / ep ranks holding the same experts (each the bytes of its parameters, or under FSDP2
    (gathered, reduce-scattered): StepCommunication.fsdp_bytes). Under gradient accumulation (`steps`
    micro-steps) the gradients are reduced every micro-step, and FSDP2 / ZeRO-3 gather the parameters every
    micro-step (their defaults: no no_sync); ZeRO-1/2 gather the updated parameters once, after the step."""
    out = _dp_terms(layout, dense, experts)
    if steps == 1:
        return out
    if layout.zero_stage == 1:  # DeepSpeed's ZeRO-1 reduces at the accumulation boundary only (engine.py
        # allreduce_gradients: "Communicate only at gradient accumulation boundaries"; ZeRO-2's partitioned gradients
        # are reduced in every micro-step's backward, overlapping_partition_gradients_reduce_epilogue)
        return [dataclasses.replace(term, what=f"{term.what}, once a step (DeepSpeed reduces at the accumulation "
                                               f"boundary, the last of {steps} micro-steps)") for term in out]
    if layout.zero_stage == 2:  # the gradients' reduce-scatter each micro-step, the parameters' gather once
        held = [(params, max(1, layout.shard_degree // split)) for params, split in ((dense, 1), (experts, layout.ep))
                if params and layout.dp * layout.cp // split > 1]  # the terms _dp_terms gave, in its order
        return [CommTerm(term.kind, f"{term.what}: the gradients' each of {steps} micro-steps",
                         _ceil((n - 1) * (steps * params + params), n),
                         term.formula.replace("(G + P)", f"({steps}·G + P)"),
                         f"{n - 1}/{n} × ({steps} × {params:,} + {params:,})")
                for term, (params, n) in zip(out, held)]
    return [CommTerm(term.kind, f"{term.what}, each of {steps} micro-steps", steps * term.bytes,
                     f"{steps} × ({term.formula})", f"{steps} × {term.bytes:,} ({term.arithmetic})")
            for term in out]


def _dp_terms(layout: ParallelLayout, dense: int | Moved, experts: int | Moved) -> list[CommTerm]:
    ranks = layout.dp * layout.cp
    out = []
    for label, params, split in (("", dense, 1), (" (routed experts)", experts, layout.ep)):
        same = ranks // split  # ranks holding the same parameters
        p, g = params if isinstance(params, tuple) else (params, params)
        if not g or same == 1:
            continue
        group = "dp × cp" + (" / ep" if split > 1 else "")
        names = ("Pe", "Ge") if split > 1 else ("P", "G")
        given = f"{names[0]} = {names[1]} = {g:,} B" if not isinstance(params, tuple) else (
            f"{names[0]} = {p:,} B, the parameters padded as fully_shard pads them, gathered in "
            + ("16 bits (its MixedPrecisionPolicy's param_dtype)" if layout.fsdp_mixed_precision == "policy" else
               "the dtype they train in (torch.autocast casts after the gather)")
            + f"; {names[1]} = {g:,} B, reduce-scattered in fp32"
            + (" (reduce_dtype)" if layout.fsdp_mixed_precision == "policy" else ""))
        if layout.zero_stage == 0:
            n = same
            out.append(CommTerm("dp", f"DDP: all-reduce of the gradients{label}", _ceil(2 * (n - 1) * g, n),
                                f"2(n−1)/n · G, n = {group} = {n}", f"2·{n - 1}/{n} × {g:,} ({given})"))
            continue
        n = max(1, layout.shard_degree // split)  # ranks a shard is cut over
        replicas = same // n
        # FSDP2 beside a pipeline gathers each unit once a step: torchtitan keeps the units gathered after the forward
        # (reshard_after_forward = not pp_enabled) and torch's PipelineStage runs every microbatch's backward with
        # set_reshard_after_backward(False) and set_requires_gradient_sync(False), reducing once in
        # perform_reduce_grad after the last backward
        once = _fsdp(layout) and layout.pp > 1
        twice, two = (1, "") if once else (2, "2")
        when = (" (once a step: gathered at the stage's first forward and kept through every microbatch, torchtitan's "
                "reshard_after_forward False under a pipeline; reduced once after the last backward, torch's "
                "PipelineStage.perform_reduce_grad)") if once else " (forward and backward)"
        if layout.zero_stage in (1, 2):
            out.append(CommTerm("dp", f"{shard_words(layout)}: reduce-scatter of the gradients, all-gather of "
                                      f"the updated parameters{label}", _ceil((n - 1) * (g + p), n),
                                f"(n−1)/n · (G + P), n = {group} = {n}", f"{n - 1}/{n} × ({g:,} + {p:,}) "
                                                                         f"({given})"))
        elif replicas > 1:
            inside = _ceil((n - 1) * (twice * p + g), n)
            across = _ceil(2 * (replicas - 1) * _ceil(g, n), replicas)
            out.append(CommTerm("dp", f"{shard_words(layout)}: all-gather of the parameters{when} and "
                                      f"reduce-scatter of the gradients inside a shard group of "
                                      f"g = {n}, all-reduce of the gradient shard across r = {replicas} "
                                      f"groups{label}", inside + across, f"(g−1)/g · ({two}P + G) + 2(r−1)/r · G/g",
                                f"{n - 1}/{n} × ({f'{twice} × ' if twice > 1 else ''}{p:,} + {g:,}) + "
                                f"2·{replicas - 1}/{replicas} × {_ceil(g, n):,} ({given})"))
        else:
            out.append(CommTerm("dp", f"{shard_words(layout)}: all-gather of the parameters{when}, "
                                      f"reduce-scatter of the gradients{label}",
                                _ceil((n - 1) * (twice * p + g), n), f"(n−1)/n · ({two}P + G), n = {group} = {n}",
                                f"{n - 1}/{n} × ({f'{twice} × ' if twice > 1 else ''}{p:,} + {g:,}) ({given})"))
    return out


def deepspeed_zero0_dp_terms(layout: ParallelLayout, dense: int, experts: int, steps: int = 1) -> list[CommTerm]:
    """bf16-master at ZeRO 0, DeepSpeed's engine (not torch's DDP): the bf16 gradients all-reduced once a step, at
    the accumulation boundary (engine.py allreduce_gradients: "Communicate only at gradient accumulation boundaries";
    buffered_allreduce_fallback, BF16_Optimizer's get_grads_for_reduction: its bf16 accumulation buffer); beside a
    pipeline DeepSpeed's BF16_Optimizer (states.bf16_optimizer) then all-gathers the updated bf16 parameters over the
    data-parallel group (bf16_optimizer.py update_lp_params → all_gather_dp_groups), each rank having stepped its
    partition; without a pipeline FP16_Optimizer in bf16 steps whole masters, and gathers nothing. G = P = the bf16
    bytes the stage holds."""
    ranks = layout.dp * layout.cp
    gathers = bf16_optimizer(MASTER_PRECISION, layout)
    out = []
    for label, g, split in (("", dense, 1), (" (routed experts)", experts, layout.ep)):
        n = ranks // split
        if not g or n == 1:
            continue
        group = "dp × cp" + (" / ep" if split > 1 else "")
        names = ("Pe", "Ge") if split > 1 else ("P", "G")
        once = f", once a step (at the accumulation boundary, the last of {steps} micro-steps)" if steps > 1 else ""
        if gathers:
            out.append(CommTerm("dp", f"DeepSpeed's BF16_Optimizer: all-reduce of the bf16 gradients, all-gather of "
                                      f"the updated bf16 parameters{label}{once}",
                                _ceil(2 * (n - 1) * g, n) + _ceil((n - 1) * g, n),
                                f"2(n−1)/n · G + (n−1)/n · P, n = {group} = {n}",
                                f"2·{n - 1}/{n} × {g:,} + {n - 1}/{n} × {g:,} ({names[1]} = {names[0]} = {g:,} B, "
                                "bf16)"))
        else:
            out.append(CommTerm("dp", f"DeepSpeed's engine (ZeRO 0): all-reduce of the bf16 gradients{label}{once}",
                                _ceil(2 * (n - 1) * g, n), f"2(n−1)/n · G, n = {group} = {n}",
                                f"2·{n - 1}/{n} × {g:,} ({names[1]} = {g:,} B, bf16)"))
    return out


def main_grad_dp_terms(layout: ParallelLayout, dense: int, experts: int, steps: int = 1) -> list[CommTerm]:
    """bf16-main-grad's data-parallel collectives, Megatron-LM's (megatron/core/distributed/param_and_grad_buffer.py,
    _ParamAndGradBucketGroup.start_grad_sync and start_param_sync): the grad buffer is fp32 under bf16
    (training/arguments.py sets accumulate_allreduce_grads_in_fp32; group_params_for_buffers: grad_dtype
    torch.float), so G is 4 B a trained element, twice the bf16 bytes `dense` / `experts` the stage holds; plain DDP
    all-reduces it over the data-parallel group, the distributed optimizer reduce-scatters it and all-gathers the
    bf16 param buffer (param_data, P = 2 B an element) over the same group. Dense parameters over dp × cp (Megatron's data-parallel
    group with context parallel), routed experts over the expert-data-parallel group (dp × cp / ep ranks). Under
    gradient accumulation both run once a step: the schedules (pipeline_parallel/schedules.py,
    forward_backward_no_pipelining) run every micro-step but the last under the DDP's no_sync, the fp32 main_grad
    accumulating them. The buffer's alignment padding (each bucket to a multiple of the group, each parameter's
    start to 64 elements) is not counted."""
    ranks = layout.dp * layout.cp
    out = []
    for label, p, split in (("", dense, 1), (" (routed experts)", experts, layout.ep)):
        n = ranks // split
        if not p or n == 1:
            continue
        g = 2 * p  # the fp32 main_grad: 4 B an element where the bf16 weight is 2
        group = "dp × cp" + (" / ep" if split > 1 else "")
        names = ("Pe", "Ge") if split > 1 else ("P", "G")
        given = (f"{names[1]} = {g:,} B, the fp32 main-gradient buffer, 4 B an element" if layout.zero_stage == 0
                 else f"{names[1]} = {g:,} B, the fp32 main-gradient buffer, 4 B an element; {names[0]} = {p:,} B, "
                      "the bf16 parameters, 2 B")
        once = f", once a step (every micro-step but the last of {steps} under the DDP's no_sync)" if steps > 1 else ""
        if layout.zero_stage == 0:
            out.append(CommTerm("dp", f"Megatron's DDP: all-reduce of the fp32 gradients{label}{once}",
                                _ceil(2 * (n - 1) * g, n), f"2(n−1)/n · G, n = {group} = {n}",
                                f"2·{n - 1}/{n} × {g:,} ({given})"))
        else:
            out.append(CommTerm("dp", f"Megatron's distributed optimizer: reduce-scatter of the fp32 gradients, "
                                      f"all-gather of the updated bf16 parameters{label}{once}",
                                _ceil((n - 1) * (g + p), n), f"(n−1)/n · (G + P), n = {group} = {n}",
                                f"{n - 1}/{n} × ({g:,} + {p:,}) ({given})"))
    return out


def _tokens(facts: ModelFacts, layout: ParallelLayout, replica: int) -> tuple[int, int, int]:
    """(microbatches, sequences a microbatch, tokens of a sequence on the rank)."""
    micro = layout.micro_batches if layout.pp > 1 else 1
    return micro, replica // micro, facts.seq // layout.cp


def tp_term(facts: ModelFacts, layout: ParallelLayout, replica: int, stage: Any) -> CommTerm | None:
    t = layout.tp
    if t == 1:
        return None
    m, b, s = _tokens(facts, layout, replica)
    x = b * s * facts.hidden * facts.act
    layers = len(stage.layers)
    count = 4 * layers + (2 * layers if facts.checkpointing else 0) + (1 if stage.first else 0) + \
        (1 if stage.last else 0)
    value = m * count * _ceil(2 * (t - 1) * x, t)
    what = "all-gather + reduce-scatter (sequence parallel)" if layout.sp else "all-reduce"
    return CommTerm("tp", f"tensor parallel: the activations' {what}, 4 a layer (forward and backward)"
                          + (" + 2 recomputed" if facts.checkpointing else "") + " + the embedding's and head's",
                    value, "m · c · 2(t−1)/t · b·s·h·a",
                    f"{m} microbatch{'es' if m > 1 else ''} × {count} × 2·{t - 1}/{t} × {b}·{s:,}·{facts.hidden:,}"
                    f"·{facts.act} B (c = 4 × {layers} layers" + (f" + 2 × {layers} recomputed" if
                                                                 facts.checkpointing else "")
                    + (" + 1 embedding" if stage.first else "") + (" + 1 head" if stage.last else "") + ")")


def pp_terms(facts: ModelFacts, layout: ParallelLayout, replica: int, stage: Any, tied: int) -> list[CommTerm]:
    if layout.pp == 1:
        return []
    m, b, s = _tokens(facts, layout, replica)
    v = layout.virtual_stages
    piece = layout.tp if layout.sp else 1
    # the residual stream between stages: 16-bit under the policy (its layers run on 16-bit parameters)
    residual = 2 if layout.fsdp_mixed_precision == "policy" and _fsdp(layout) else facts.residual
    y = _ceil(b * s * facts.hidden * residual, piece)
    sends = (v - (1 if stage.last else 0)) + (v - (1 if stage.first else 0))
    out = [CommTerm("pp", "pipeline: each microbatch's activation sent to the next stage and its gradient to "
                          "the previous, at every boundary the device holds", m * sends * y,
                    "m · sends · b·s·h·r" + (" / t" if piece > 1 else ""),
                    f"{m} × {sends} × {b}·{s:,}·{facts.hidden:,}·{residual} B"
                    + (f" / {piece}" if piece > 1 else ""))]
    if tied:
        out.append(CommTerm("pp", "pipeline: the tied embedding's gradient all-reduced between the first and "
                                  "last stage (Megatron's embedding group)", tied, "2·(2−1)/2 · E",
                            f"{tied:,} B"))
    return out


def ep_term(facts: ModelFacts, layout: ParallelLayout, replica: int, stage: Any) -> CommTerm | None:
    e = layout.ep
    if e == 1:
        return None
    m, b, s = _tokens(facts, layout, replica)
    layers = sum(1 for index in stage.layers if index in facts.moe_layers)
    if not layers:
        return None
    tokens = _ceil(b * s, layout.tp if layout.sp else 1)
    count = 4 + (2 if facts.checkpointing else 0)
    value = m * layers * count * _ceil((e - 1) * facts.top_k * tokens * facts.hidden * facts.act, e)
    return CommTerm("ep", "expert parallel: the routed tokens' all-to-all, dispatch and combine, forward and "
                          "backward" + (" + recomputed" if facts.checkpointing else "") + ", balanced routing",
                    value, f"m · L_moe · {count} · (e−1)/e · k·T·h·a",
                    f"{m} × {layers} MoE layers × {count} × {e - 1}/{e} × {facts.top_k}·{tokens:,}·"
                    f"{facts.hidden:,}·{facts.act} B")


def cp_term(facts: ModelFacts, layout: ParallelLayout, replica: int, stage: Any) -> CommTerm | None:
    c = layout.cp
    if c == 1:
        return None
    m, b, s = _tokens(facts, layout, replica)
    kv = max(1, facts.kv_heads // layout.tp)
    z = 2 * b * s * kv * facts.head_dim * facts.act
    layers = len(stage.layers)
    count = 3 + (1 if facts.checkpointing else 0)
    value = m * layers * count * (c - 1) * z
    return CommTerm("cp", "context parallel: ring attention's K and V passed round the ring, forward; K, V and "
                          "their gradients, backward", value, f"m · L · {count} · (cp−1) · 2·b·s·kv·hd·a",
                    f"{m} × {layers} layers × {count} × {c - 1} × 2·{b}·{s:,}·{kv}·{facts.head_dim}·{facts.act} B")


def _ceil(numerator: int, denominator: int) -> int:
    return -(-numerator // denominator)
