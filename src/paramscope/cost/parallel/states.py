"""One device's model states under a layout: the tensor- and expert-parallel shards, then the data-parallel share.

    placements (rules.py) → each parameter as the device holds it → model_states() on those (exact, per dtype)
    → the data-parallel share:
        ZeRO (DeepSpeed): one flat, padded buffer per state, ⌈bytes / d⌉ a rank (stage 1 the optimizer states and
            master weights, 2 also the gradients, 3 also the weights);
        FSDP2: every parameter cut along its first dimension, ⌈dim0 / d⌉ rows a rank (padded, as fully_shard
            allocates them), its gradient and optimizer states alike; each tensor keeps its own step scalar.
    Routed experts under expert parallelism are sharded over d / ep ranks (the data-parallel ranks their experts
    leave), the rest over d, as torchtitan's FSDP does.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Iterable

from ...words import counted
from ..memory.states import MAIN_GRAD_PRECISION, MASTER_PRECISION, ModelStates, grad_buffer, model_states
from .layout import ParallelLayout
from .rules import Placement


@dataclass(frozen=True)
class DeviceStates:
    """The model states one device holds, by kind, with how each was reached."""

    weights: int
    gradients: int
    optimizer: int
    master_weights: int
    unsharded: ModelStates  # the device's tensor/expert-parallel shards before any data-parallel share
    arithmetic: str  # how the data-parallel share was taken
    # bf16-main-grad: the fp32 main-gradient buffer, resident at every moment (Megatron-Core's DDP: held whole on every
    # data-parallel rank, the distributed optimizer included); `gradients` is then 0, as no .grad is held past its hook.
    # bf16-master under DeepSpeed's BF16_Optimizer (a pipeline at ZeRO 0): its bf16 gradient-accumulation buffer,
    # resident at every moment beside the bf16 .grad (bf16_optimizer)
    grad_buffer: int = 0

    @property
    def bytes(self) -> int:
        return self.weights + self.gradients + self.optimizer + self.master_weights + self.grad_buffer


def device_states(params: Iterable, placements: Iterable[Placement], layout: ParallelLayout, *, precision: str,
                  optimizer: str, trainable: frozenset[str], own: frozenset[str] = frozenset()) -> DeviceStates:
    """Rank 0's model states (the largest share wherever a cut is uneven)."""
    by_name = {p.name: p for p in placements}
    local = [dataclasses.replace(p, shape=by_name[p.name].local_shape, numel=by_name[p.name].local_numel)
             for p in params]
    whole = model_states(local, precision=precision, optimizer=optimizer, trainable=trainable, own=own)
    if precision == MAIN_GRAD_PRECISION:
        routed = [p for p in local if by_name[p.name].experts_split]
        return main_grad_states(whole, layout, model_states(routed, precision=precision, optimizer=optimizer,
                                                            trainable=trainable, own=own) if routed else None)
    stage = layout.zero_stage
    degree = layout.shard_degree
    accumulation = 0
    if bf16_optimizer(precision, layout):  # its masters and moments partitioned as ZeRO-1's, its buffer whole
        stage, degree, accumulation = 1, layout.dp * layout.cp, whole.gradients.bytes
    if stage == 0 or degree == 1:
        return DeviceStates(whole.weights.bytes, whole.gradients.bytes, whole.optimizer.bytes,
                            whole.master_weights.bytes, whole,
                            BF16_OPTIMIZER_WORDS if accumulation else "no data-parallel sharding: every rank holds these",
                            accumulation)
    experts = [p for p in local if by_name[p.name].experts_split]
    expert_degree = max(1, degree // layout.ep) if experts else degree
    if layout.shard in ("fsdp", "hsdp"):
        def shards(group: list, d: int) -> list:
            return [dataclasses.replace(p, shape=(-(-p.shape[0] // d), *p.shape[1:]),
                                        numel=(-(-p.shape[0] // d)) * (p.numel // p.shape[0] if p.shape[0] else 0))
                    if p.shape else p for p in group]
        def expert_shards(group: list, d: int) -> list:
            # a rank's packed experts [E/ep, ·, ·] over more ranks than it holds experts: cut on dim 1, as
            # torchtitan's apply_fsdp does (dim 0 would leave ranks holding padding)
            return [dataclasses.replace(p, shape=(p.shape[0], -(-p.shape[1] // d), p.shape[2]),
                                        numel=p.shape[0] * -(-p.shape[1] // d) * p.shape[2])
                    if len(p.shape) == 3 and d > p.shape[0] else shards([p], d)[0] for p in group]
        names = {p.name for p in experts}
        sharded = shards([p for p in local if p.name not in names], degree) + expert_shards(experts, expert_degree)
        part = model_states(sharded, precision=precision, optimizer=optimizer, trainable=trainable, own=own)
        how = (f"FSDP2 over {degree} ranks: every parameter cut along its first dimension, ⌈dim0 / {degree}⌉ rows "
               "a rank (padded), its gradient and optimizer states alike")
        if experts and expert_degree != degree:
            how += f"; routed experts over {counted(expert_degree, 'rank')} ({degree} / ep {layout.ep})"
            if any(len(p.shape) == 3 and expert_degree > p.shape[0] for p in experts):
                how += (", cut along their second dimension (more ranks than a rank's experts: torchtitan's "
                        "Shard(1)), ⌈dim1 / " + str(expert_degree) + "⌉ rows")
        return DeviceStates(part.weights.bytes, part.gradients.bytes, part.optimizer.bytes, part.master_weights.bytes,
                            whole, how)

    # DeepSpeed-MoE: the expert parameters' own groups partitioned over the expert-data-parallel group (the d / ep
    # ranks holding the same experts: stage_1_and_2.py's real_dp_process_group of a MoE param group), the rest over d
    names = {p.name for p in experts}
    groups = [(model_states([p for p in local if p.name not in names], precision=precision, optimizer=optimizer,
                            trainable=trainable, own=own), degree)]
    if experts:
        groups.append((model_states(experts, precision=precision, optimizer=optimizer, trainable=trainable, own=own),
                       expert_degree))

    def share(kind: str, sharded: bool) -> int:
        return sum(-(-getattr(part, kind).bytes // d) if sharded else getattr(part, kind).bytes for part, d in groups)

    how = (f"ZeRO-{stage} over {degree} ranks: ⌈bytes / {degree}⌉ of each flat buffer of "
           + {1: "optimizer states and master weights", 2: "optimizer states, master weights and gradients",
              3: "optimizer states, master weights, gradients and weights"}[stage])
    if accumulation:
        how = (f"{BF16_OPTIMIZER_WORDS}: ⌈bytes / {degree}⌉ of the fp32 masters and moments over the {degree} "
               "data-parallel ranks")
    if experts:
        how += (f"; the routed experts' over their expert-data-parallel group of {counted(expert_degree, 'rank')} "
                f"({degree} / ep {layout.ep}: the ranks holding the same experts), as DeepSpeed-MoE partitions them")
    return DeviceStates(share("weights", stage >= 3), share("gradients", stage >= 2), share("optimizer", True),
                        share("master_weights", True), whole, how, accumulation)


# DeepSpeed's BF16_Optimizer, named where a figure follows it
BF16_OPTIMIZER_WORDS = ("DeepSpeed's BF16_Optimizer (its PipelineEngine's optimizer under bf16 at ZeRO 0): the fp32 "
                        "masters and Adam moments partitioned over the data-parallel ranks as ZeRO-1 does, the bf16 "
                        "gradients and a gradient-accumulation buffer of the stage's parameters whole")


def bf16_optimizer(precision: str, layout: ParallelLayout) -> bool:
    """Whether bf16-master's rank runs DeepSpeed's BF16_Optimizer (runtime/bf16_optimizer.py) rather than
    DeepSpeedZeroOptimizer or FP16_Optimizer: engine.py's _do_optimizer_sanity_check picks it under bf16 with ZeRO 0
    and pipeline parallelism (model dtype = grad_accum_dtype, both bf16 by default: BFLOAT16, its "BF16 gradient
    accumulation is not safe numerically" warning), and under ZeRO-1 only with data_types.grad_accum_dtype fp32 (not
    DeepSpeed's default: ZeRO-1 takes DeepSpeedZeroOptimizer; ZeRO 0 without a pipeline DDP_BFLOAT16, FP16_Optimizer
    in bf16, the masters whole). BF16_Optimizer._setup_for_real_optimizer then keeps, besides the bf16 weights and
    their .grad (cleared in place, clear_lp_grads(set_to_none=False), never freed in the step): the fp32 master
    partition, the flat bf16 weights ⌈/ d⌉ over the data-parallel group (fp32_groups_flat_partition; the optimizer's
    param group is that partition, so its moments too) and fp32_groups_gradients_flat, zeros_like the whole flat
    bf16 group in grad_acc_dtype (bf16 here), allocated at construction and zeroed in place (clear_hp_grads): the
    accumulation buffer every microbatch's gradients are added into (update_hp_grads), resident at every moment. Its
    step casts the rank's partition of that buffer to fp32 (`grad_partition.to(fp32)`), the masters' gradients, freed
    after optimizer.step (stage_step counts it: one per master element). The flat groups' alignment padding (to 2·d
    elements) is not counted."""
    return precision == MASTER_PRECISION and layout.pp > 1 and layout.zero_stage == 0


def main_grad_states(whole: ModelStates, layout: ParallelLayout, experts: ModelStates | None = None) -> DeviceStates:
    """bf16-main-grad's states on a rank holding `whole` (its tensor/pipeline/expert shard; `experts`: the routed
    experts' part of it), Megatron-LM's: the bf16 weights and the fp32 main-gradient buffer whole on every
    data-parallel rank (the buffer is reduce-scattered in place under the distributed optimizer, still allocated
    whole; the experts' in a buffer of their own, DistributedDataParallel's expert_parallel_buffers), resident from
    before the forward (grad_buffer; no .grad held); the fp32 masters and moments whole under DDP, under the
    distributed optimizer ⌈/ d⌉ (ZeRO-1's share of its flat buffer: the padding Megatron adds, each bucket to a
    multiple of d and each parameter's start to 64 elements, not counted) over d = dp × cp, the ranks holding the
    same dense parameters (parallel_state's data-parallel group with context parallel, which
    DistributedDataParallel takes for the dense buffers), and the routed experts' over the expert-data-parallel
    group, dp × cp / ep ranks (the expert buffers' intra_expt_dp group; with Megatron's default expert tensor
    parallel = tp)."""
    buffer = grad_buffer(whole)
    degree = layout.shard_degree
    if layout.zero_stage == 0 or degree == 1:
        return DeviceStates(whole.weights.bytes, 0, whole.optimizer.bytes, whole.master_weights.bytes, whole,
                            "Megatron's DDP without the distributed optimizer: every data-parallel rank holds these",
                            buffer)
    expert_degree = max(1, degree // layout.ep)
    groups = [(whole.optimizer.bytes, whole.master_weights.bytes, degree)]
    if experts is not None:  # the dense part over dp × cp, the experts' over their expert-data-parallel group
        groups = [(whole.optimizer.bytes - experts.optimizer.bytes,
                   whole.master_weights.bytes - experts.master_weights.bytes, degree),
                  (experts.optimizer.bytes, experts.master_weights.bytes, expert_degree)]
    how = (f"Megatron's distributed optimizer over {degree} data-parallel ranks"
           + (" (dp × cp)" if layout.cp > 1 else "") + f": ⌈bytes / {degree}⌉ of the fp32 masters and moments a rank")
    if experts is not None:
        how += (f", the routed experts' over their expert-data-parallel group of {counted(expert_degree, 'rank')} "
                f"({degree} / ep {layout.ep})")
    return DeviceStates(whole.weights.bytes, 0, sum(-(-o // d) for o, _, d in groups),
                        sum(-(-m // d) for _, m, d in groups), whole,
                        how + ", the bf16 weights and the fp32 gradient buffer whole", buffer)


def main_grad_layout_words(layout: ParallelLayout) -> str:
    """Which rule bf16-main-grad follows under `layout`, named: Megatron-LM's."""
    over = (f"its distributed optimizer sharding the fp32 masters and Adam moments over the {layout.shard_degree} "
            "data-parallel ranks (6 + 12/d B a parameter, ZeRO-1's share)" if layout.zero_stage and
            layout.shard_degree > 1 else "plain DDP, every data-parallel rank holding the masters and moments whole "
            "(18 B a parameter)")
    words = [f"bf16-main-grad: Megatron-LM's bf16 training (Megatron-Core's DistributedDataParallel with "
             "accumulate_allreduce_grads_in_fp32), bf16 weights, the fp32 main-gradient buffer held whole and resident "
             f"at every moment, fp32 masters and moments, {over}"]
    if layout.tp > 1:
        words.append(f"beside tp {layout.tp} each rank's states are its shard's (Megatron's tensor parallelism; here as "
                     "torch's DTensor runs it, the activations bf16-pure's)")
    if layout.pp > 1:
        words.append(f"beside pp {layout.pp} each stage holds its own parameters' buffer, masters and moments")
    if layout.cp > 1:
        words.append(f"beside cp {layout.cp} the cp ranks hold the same weights, so the buffer is whole on each and "
                     "the distributed optimizer shards over dp × cp (Megatron's data-parallel group with context "
                     "parallel); the activations torch's ring attention's, as on a bf16-pure rank")
    if layout.ep > 1:
        words.append(f"beside ep {layout.ep} each rank's routed experts keep a buffer of their own (Megatron's expert "
                     "grad buffers), whole, and the distributed optimizer shards their masters and moments over "
                     f"the expert-data-parallel group ({max(1, layout.shard_degree // layout.ep)} of the ranks: those "
                     "holding the same experts)")
    words.append("the optimizer step casts nothing (main_param.grad is the fp32 buffer itself)")
    return "; ".join(words)


def rank_master_copy(params: Iterable, placements: Iterable[Placement], layout: ParallelLayout, *, optimizer: str,
                     trainable: frozenset[str], own: frozenset[str] = frozenset()) -> int:
    """Bytes of the fp32 gradients bf16-master's optimizer step casts on one rank: one per element of the fp32 master
    the rank updates, so its master weights' bytes (DeepSpeed casts only the partition it owns:
    DeepSpeedZeroOptimizer.step's `flat_grad_partition.to(fp32)`): the rank's tensor/expert-parallel shard, and
    ⌈/ d⌉ of it under ZeRO 1-3 (device_states' share)."""
    return device_states(params, placements, layout, precision=MASTER_PRECISION, optimizer=optimizer,
                         trainable=trainable, own=own).master_weights


def master_whole_gradient(full: int, local: int, cast: str) -> tuple[int, str]:
    """(bytes, words) bf16-master's optimizer step adds on a tensor-parallel rank where torch's DTensor gives the
    vocabulary-parallel embedding its gradient whole (`full` bytes of bf16 on every rank, the rank's shard `local`).
    `cast` "whole" (replicated data parallel, no ZeRO partition): the step casts each gradient as the rank holds it,
    this one whole, 2·full fp32 bytes against the shard's 2·local in the rank's copy (traced: MasterCopyOptimizer on
    the rank's DTensors); the fused step's shard of that fp32 gradient and the sequence-parallel norms' all-reduced
    fp32 gradients are made after the bf16 gradients are freed, a lower moment (smaller than the rank's other bf16
    gradients), so neither is counted. "partition" (ZeRO 1-3): DeepSpeed casts only the fp32 partition of its flat
    buffer of the rank's shards, so nothing beyond the bf16 gradient held whole. "buffer" (bf16-main-grad): its hook
    adds the whole gradient into the rank's fp32 main_grad shard and frees it as the backward ends, so the step holds
    nothing of it (traced: MainGradOptimizer on the rank's DTensors)."""
    more = full - local
    if cast == "buffer":
        return 0, ("the embedding's whole gradient (torch's DTensor) added into the rank's fp32 main_grad by its hook "
                   "and freed: none held at the step")
    words = f"the embedding's gradient whole on every rank (torch's DTensor), + {more:,}"
    if cast == "partition":
        return more, f"{words}; the step casts the rank's ZeRO partition of its shards only"
    return 3 * more, f"{words}, and its fp32 cast for the master copy whole too, + {2 * more:,}"


def stage_step(ctx: Any, dev: DeviceStates) -> tuple[int, str]:
    """The optimizer step's (bytes, words) beside the gradients on a pipeline stage holding `dev`: the step of the
    layout (ctx.step); under bf16-master with the stage's own fp32 gradient copy added, one per element of the
    masters the stage updates (its parameters' tp shard, ⌈/ d⌉ under ZeRO 1-2: dev.master_weights), where ctx.step
    holds none (memory/training.py leaves a pipeline's to its stages)."""
    step_bytes, step_text = ctx.step
    if ctx.states.precision != MASTER_PRECISION or ctx.layout.pp == 1:
        return step_bytes, step_text
    copy = dev.master_weights
    if bf16_optimizer(ctx.states.precision, ctx.layout):
        return step_bytes + copy, (f"the rank's partition of the bf16 accumulation buffer cast to fp32 for its "
                                   f"masters, {copy:,} B (BF16_Optimizer.step's grad_partition.to(fp32), freed after "
                                   f"the optimizer's step; the bf16 gradients held through it); {step_text}")
    return step_bytes + copy, (f"the fp32 gradients cast for the stage's master copy, {copy:,} B (one per element of "
                               "the masters it updates; held through the optimizer step, the bf16 gradients freed "
                               f"once cast, as DeepSpeed's step does); {step_text}")


def master_search_words() -> str:
    """What every layout of a bf16-master search follows, named (memory under each layout says it per layout)."""
    return ("bf16-master (DeepSpeed's bf16): each device holds its shard's bf16 weights and gradients and the fp32 "
            "masters and Adam moments of that shard, ZeRO partitioning them over dp × cp (Megatron-DeepSpeed's "
            "composition beside tp; beside ep the routed experts' over their expert-data-parallel group, "
            "DeepSpeed-MoE's; a pipeline stage its own parameters', DeepSpeed's PipelineEngine, so ZeRO-2 and -3 "
            "layouts with a pipeline are passed over, as are ZeRO-3's with ep); the step holds the device's fp32 "
            "gradient copy; DeepSpeed's ZeRO reduces the bf16 gradients (2 B an element) and under ZeRO-3 gathers "
            "the bf16 weights, as the dp bytes count them")
